"""Serving (issue 20): the exporter's command line, the files a serve job's run directory
holds beside the rank files, and the probe's one-token request. Spelt here only.

* ``python -m mlxops.trainer.export`` converts a bundled-trainer checkpoint to mlx-lm's
  layout on the node that holds it (:func:`export_args` builds its words, :func:`export_parser`
  reads them); it prints one JSON line, :class:`ExportAnswer`.
* A serve job whose model is a training job's checkpoint exports it first into
  :data:`SERVE_MODEL_DIR` of its own run directory.
* The watchdog's probe (:data:`PROBE_REQUEST` to :data:`PROBE_PATH`) asks for one token.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

from mlxops.node.protocol.decode import Record

EXPORT_MODULE = "mlxops.trainer.export"
EXPORT_ARCHES = ("llama", "qwen2")
#: In a serve job's run directory: the model exported from a training job's checkpoint.
SERVE_MODEL_DIR = "model"
#: ... and the node's count of the requests the server answered (node/serverlog.py).
SERVE_COUNT = "requests.json"
#: mlx-lm's server, as a module: ``python -m mlx_lm server ...`` (0.32's own spelling).
SERVER_ARGV = ("-m", "mlx_lm", "server")
PROBE_PATH = "/v1/completions"
#: One token, greedy: the cheapest request that goes through the whole model.
PROBE_REQUEST = {"prompt": "\n", "max_tokens": 1, "temperature": 0.0}


@dataclass
class ExportAnswer(Record):
    step: int
    arch: str
    checkpoint: str                      # the step directory exported (node path)
    out: str
    files: list[str]


def export_args(*, run_dir: str, step: int | None = None, best: bool = False,
                arch: str = EXPORT_ARCHES[0]) -> list[str]:
    """``-m mlxops.trainer.export ...`` without ``--out`` (the caller adds it: a shell
    variable on one path, a path on another). ``best``: the run's best checkpoint
    (``best/``, the lowest validation loss), else ``step``'s, else the newest."""
    return ["-m", EXPORT_MODULE, "--run-dir", run_dir, "--arch", arch,
            *(["--step", str(step)] if step is not None else []),
            *(["--best"] if best else [])]


def export_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m {EXPORT_MODULE}")
    p.add_argument("--run-dir", required=True)
    which = p.add_mutually_exclusive_group()
    which.add_argument("--step", type=int, default=None)
    which.add_argument("--best", action="store_true")
    p.add_argument("--arch", choices=EXPORT_ARCHES, default=EXPORT_ARCHES[0])
    p.add_argument("--out", required=True)
    return p


def server_options(options: Sequence[tuple[str, object]]) -> list[str]:
    """``[("max_tokens", 64), ("pipeline", True)]`` -> ``["--max-tokens", "64",
    "--pipeline"]``: mlx-lm's flags are its option names with dashes."""
    words: list[str] = []
    for name, value in options:
        flag = "--" + name.replace("_", "-")
        if value is True:
            words.append(flag)
        elif value is not None and value is not False:
            words += [flag, str(value)]
    return words
