"""A job's ``serve:`` section (docs/job-file.md, "Serving"): mlx-lm's OpenAI-compatible
server run as the job's ranks, one per host, instead of a trainer.

Checked when the job file loads, every key (one line naming the file and the key, exit 2):

* ``model``: a directory on the nodes in mlx-lm's layout, or ``{job: NAME, step: N}``
  (or ``best: true``), a bundled-trainer job's checkpoint (its newest without ``step``,
  its best with ``best``), exported on each node
  into the serve job's run directory before the server starts
  (:mod:`mlxops.trainer.export`);
* ``parallel``: ``pipeline`` or ``tensor``, how mlx-lm spreads the model over several hosts
  (required with more than one; its ``--pipeline`` flag, else tensor parallel). A model
  exported for ``pipeline`` is written as mlx-lm's ``qwen2`` (the same function; its
  ``llama`` has no pipeline), for ``tensor`` or one host as ``llama``;
* ``port`` (8080) and ``bind`` (``127.0.0.1``: the node's loopback, reached through
  ``mlxops serve``'s forward; another address exposes the server on the network);
* the server's own options, passed as its flags (:data:`SERVER_OPTIONS`);
* ``probe_timeout``: seconds the watchdog's one-token completion may wait for its answer;
  the server counts as hung when two in a row wait that long and its request count has not
  moved since the last answered probe, or ``hung_probes`` (3) do so in a row however it moves
  (:mod:`mlxops.jobs.serveprobe`); ``start_timeout``: seconds a new server may take to
  answer at all (loading the model).
"""

from __future__ import annotations

import ipaddress
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mlxops.errors import bad_input
from mlxops.node.protocol.serve import EXPORT_ARCHES

PIPELINE, TENSOR = "pipeline", "tensor"
PARALLEL_MODES = (PIPELINE, TENSOR)
#: mlx-lm server options a job may set, with their kind (its flags: dashes for '_').
SERVER_OPTIONS: dict[str, type] = {
    "max_tokens": int, "decode_concurrency": int, "prompt_concurrency": int,
    "prompt_cache_size": int, "prompt_cache_bytes": int, "prefill_step_size": int,
    "temp": float, "top_p": float, "top_k": int, "min_p": float,
    "chat_template": str, "use_default_chat_template": bool, "log_level": str,
}
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
SERVE_KEYS = {"model", "parallel", "port", "bind", "probe_timeout", "start_timeout",
              "hung_probes", *SERVER_OPTIONS}


@dataclass(frozen=True)
class ServeSpec:
    model: str | None = None               # a directory on the nodes, or
    model_job: str | None = None           # ... a bundled-trainer job's checkpoint
    model_step: int | None = None          # ... of this step (None: its newest)
    model_best: bool = False               # ... its best (best/: lowest validation loss)
    parallel: str | None = None            # PARALLEL_MODES, with more than one host
    port: int = 8080
    bind: str = "127.0.0.1"
    probe_timeout: float = 30.0
    start_timeout: float = 300.0
    options: dict[str, Any] = field(default_factory=dict)  # SERVER_OPTIONS set
    hung_probes: int = 3                   # timed-out probes in a row that are hung anyway

    @property
    def export_arch(self) -> str:
        """The mlx-lm architecture a trainer checkpoint is exported as (module doc)."""
        return EXPORT_ARCHES[1] if self.parallel == PIPELINE else EXPORT_ARCHES[0]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ServeSpec:
        return cls(**data)


def parse_serve(path: Path, data: Any) -> ServeSpec:
    """The ``serve:`` mapping, every key checked."""
    if not isinstance(data, dict):
        raise bad_input(path, "serve", "must be a mapping (model:, port:, ...)")
    for key in data:
        if key not in SERVE_KEYS:
            raise bad_input(path, f"serve.{key}", "unknown key (known: "
                                                  f"{', '.join(sorted(SERVE_KEYS))})")
    if "model" not in data:
        raise bad_input(path, "serve.model", "required: a model directory on the nodes, or "
                                             "{job: NAME} (a training job's checkpoint)")
    model, model_job, model_step, model_best = _model(path, data["model"])
    parallel = data.get("parallel")
    if parallel is not None and parallel not in PARALLEL_MODES:
        raise bad_input(path, "serve.parallel", f"must be {' or '.join(PARALLEL_MODES)}, "
                                                f"got {parallel!r}")
    port = data.get("port", 8080)
    if not isinstance(port, int) or isinstance(port, bool) or not 1024 <= port <= 65535:
        raise bad_input(path, "serve.port", f"must be a port number from 1024 to 65535, "
                                            f"got {port!r}")
    bind = data.get("bind", "127.0.0.1")
    try:
        ipaddress.ip_address(bind)
    except (ValueError, TypeError):
        raise bad_input(path, "serve.bind", f"must be an IP address (127.0.0.1: the node's "
                                            f"loopback), got {bind!r}") from None
    timeouts = {}
    for key, default in (("probe_timeout", 30.0), ("start_timeout", 300.0)):
        value = data.get(key, default)
        if not _number(value) or value <= 0:
            raise bad_input(path, f"serve.{key}", f"must be a positive number of seconds, "
                                                  f"got {value!r}")
        timeouts[key] = float(value)
    options = {key: _option(path, key, data[key]) for key in SERVER_OPTIONS if key in data}
    hung_probes = data.get("hung_probes", 3)
    if not isinstance(hung_probes, int) or isinstance(hung_probes, bool) or hung_probes < 1:
        raise bad_input(path, "serve.hung_probes", f"must be a whole number of probes, 1 or "
                                                   f"more, got {hung_probes!r}")
    return ServeSpec(model=model, model_job=model_job, model_step=model_step,
                     model_best=model_best, parallel=parallel, port=port, bind=str(bind),
                     options=options, hung_probes=hung_probes, **timeouts)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value)


def _model(path: Path, value: Any) -> tuple[str | None, str | None, int | None, bool]:
    if isinstance(value, str) and value.strip():
        return value, None, None, False
    if isinstance(value, dict):
        for key in value:
            if key not in ("job", "step", "best"):
                raise bad_input(path, f"serve.model.{key}", "unknown key (known: job, step, "
                                                            "best)")
        job = value.get("job")
        if not isinstance(job, str) or not job:
            raise bad_input(path, "serve.model.job", f"must name a job, got {job!r}")
        step = value.get("step")
        if step is not None and (not isinstance(step, int) or isinstance(step, bool)
                                 or step < 1):
            raise bad_input(path, "serve.model.step", f"must be a checkpoint's step (a "
                                                      f"positive integer), got {step!r}")
        best = value.get("best", False)
        if not isinstance(best, bool):
            raise bad_input(path, "serve.model.best", f"must be true or false, got {best!r}")
        if best and step is not None:
            raise bad_input(path, "serve.model.best", "goes without serve.model.step "
                                                      "(choose one)")
        return None, job, step, best
    raise bad_input(path, "serve.model", f"must be a directory on the nodes or {{job: NAME}}, "
                                         f"got {value!r}")


def _option(path: Path, key: str, value: Any) -> Any:
    kind = SERVER_OPTIONS[key]
    ok = (_number(value) if kind is float
          else isinstance(value, kind) and not (kind is int and isinstance(value, bool)))
    if not ok:
        raise bad_input(path, f"serve.{key}", f"must be of kind {kind.__name__}, "
                                              f"got {value!r}")
    if kind is int and value < (0 if key == "top_k" else 1):
        raise bad_input(path, f"serve.{key}", f"must be positive, got {value!r}")
    if key == "log_level" and value not in _LOG_LEVELS:
        raise bad_input(path, f"serve.{key}", f"must be one of {', '.join(_LOG_LEVELS)}, "
                                              f"got {value!r}")
    return float(value) if kind is float else value


def check_hosts(path: Path, serve: ServeSpec, hosts: list) -> None:
    """With the job's hosts known: ``parallel`` goes with more than one host, and is
    required then."""
    if len(hosts) > 1 and serve.parallel is None:
        raise bad_input(path, "serve.parallel", f"required with {len(hosts)} hosts: pipeline "
                                                "(layers split) or tensor (weights split)")
    if len(hosts) == 1 and serve.parallel is not None:
        raise bad_input(path, "serve.parallel", "goes with several hosts; this job selects one")
