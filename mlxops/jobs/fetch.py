"""``mlxops fetch``: a fine-tuning job's adapters, from a node to the controller.

What comes back is what mlx-lm reads (``mlx_lm.generate --adapter-path DIR``,
``mlx_lm.fuse --adapter-path DIR``): ``adapters.safetensors`` (the trainable weights: the
adapters of ``lora`` / ``dora``, the trained blocks of ``full``) and
``adapter_config.json``, as the run wrote them into a checkpoint
(:mod:`mlxops.finetune.model`). Which checkpoint:

* by default the newest: the checkpoint ``ckpt/latest`` names when it is complete (has
  its ``state.json``), else the newest one that is;
* ``best``: the same under ``<run>/best/``, where the run keeps the checkpoint of the
  lowest validation loss (``best/step-<N>/`` and its ``latest``);
* a step: ``<run>/ckpt/step-<N>/``.

The node is asked in one POSIX ``sh`` command (the directory chosen there, so the answer
is what the node holds now), whose output is the chosen directory's name, then the files
as a tar, base64 on the wire (the connection's output is text). The hosts are asked in
rank order (rank 0's first) until one has it; every node writes its checkpoints, so the
first normally does. Over the job's verified connections, as every command.
"""

from __future__ import annotations

import base64
import io
import json
import os
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from mlxops import shell
from mlxops.errors import MlxopsError, UserError
from mlxops.jobs.record import JobRecord, inventory_hosts
from mlxops.node import protocol
from mlxops.transport import Connector

ADAPTERS, ADAPTER_CONFIG = "adapters.safetensors", "adapter_config.json"
#: What is fetched (into the output directory) and what is read on the way (the step).
FETCHED = (ADAPTERS, ADAPTER_CONFIG)
#: The answer's first line, before the tar's base64.
MARK = "@@mlxops:fetch "
#: Exit code of the node's command when it has no such checkpoint (not a failure of it).
NOT_THERE = 4
FETCH_TIMEOUT = 3600.0


class FetchError(MlxopsError):
    """No host has the checkpoint asked for, or what came back is not whole."""


@dataclass(frozen=True)
class Fetched:
    host: str
    source: str            # the node directory, relative to the run directory
    step: int | None       # its state.json's step, when it has one
    files: dict[str, int]  # name -> bytes, as written under the output directory
    out: Path


def which_dir(best: bool = False, step: int | None = None) -> tuple[str, int | None]:
    """``(directory, step)``: where the checkpoints asked for are (``ckpt`` or ``best``,
    run-relative), and the step (None: the newest complete one there)."""
    if best and step is not None:
        raise UserError("--best and --step: choose one")
    return (protocol.BEST_DIR if best else protocol.CKPT_DIR), step


def fetch_command(run_dir: str, where: str, step: int | None = None) -> str:
    """The node's side: choose the directory, check it holds the adapters, send them."""
    base = shell.quote(where)
    if step is None:
        # <where>/latest names the newest when it is complete; else the newest that is.
        choose = (f'd=; n=$(cat {base}/{protocol.LATEST} 2>/dev/null) && '
                  f'[ -f "{where}/$n/{protocol.CKPT_STATE}" ] && d={base}/"$n"; '
                  f'if [ -z "$d" ]; then for c in {base}/{protocol.CKPT_PREFIX}*; do '
                  f'[ -f "$c/{protocol.CKPT_STATE}" ] && d=$c; done; fi; ')
    else:
        choose = f"d={shell.quote(f'{where}/{protocol.checkpoint_name(step)}')}; "
    files = " ".join(shell.quote(f) for f in FETCHED)
    return (f"cd {shell.quote(run_dir)} || exit {NOT_THERE}; {choose}"
            f'[ -n "$d" ] && [ -f "$d/{ADAPTERS}" ] && [ -f "$d/{ADAPTER_CONFIG}" ] || '
            f'{{ echo "no adapters in ${{d:-{where}/}}" >&2; exit {NOT_THERE}; }}; '
            f"s=; [ -f \"$d/{protocol.CKPT_STATE}\" ] && s={shell.quote(protocol.CKPT_STATE)}; "
            f"printf '{MARK}%s\\n' \"$d\" && "
            f'tar -cf - -C "$d" {files} $s | base64')


def parse_answer(stdout: str) -> tuple[str, dict[str, bytes]]:
    """``(directory, {name: content})`` from the node's output."""
    first, _, body = stdout.partition("\n")
    if not first.startswith(MARK):
        raise FetchError(f"unexpected answer: {first[:80]!r}")
    try:
        raw = base64.b64decode(body)
        with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
            files = {}
            for member in tar.getmembers():
                handle = tar.extractfile(member) if member.isfile() else None
                if handle is not None:
                    files[os.path.basename(member.name)] = handle.read()
    except (ValueError, tarfile.TarError) as exc:
        raise FetchError(f"the files came back damaged: {exc}") from None
    missing = [f for f in FETCHED if f not in files]
    if missing:
        raise FetchError(f"the node sent no {missing[0]}")
    return first[len(MARK):].strip(), files


def step_of(files: Mapping[str, bytes]) -> int | None:
    try:
        step = json.loads(files[protocol.CKPT_STATE]).get("step")
    except (KeyError, ValueError, AttributeError):
        return None
    return step if isinstance(step, int) else None


def write_out(files: Mapping[str, bytes], out: Path) -> dict[str, int]:
    """The adapters' files into ``out`` (made if needed), each replaced atomically."""
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    for name in FETCHED:
        tmp = out / f".{name}.{os.getpid()}"
        tmp.write_bytes(files[name])
        os.replace(tmp, out / name)
        written[name] = len(files[name])
    return written


def fetch(record: JobRecord, connector: Connector, out: Path, *, best: bool = False,
          step: int | None = None) -> Fetched:
    """Bring the chosen checkpoint's adapters of job ``record`` into ``out``."""
    workload = record.workload
    if workload is None or not workload.adapters:
        raise UserError(f"job {record.name!r} is not a fine-tuning job (finetune:): it has "
                        "no adapters to fetch")
    where, step = which_dir(best, step)
    hosts = inventory_hosts(record)
    order = list(dict.fromkeys(r.host for r in sorted(record.ranks, key=lambda r: r.rank)))
    misses = []
    for name in order:
        h = record.host(name)
        result = connector.connect(hosts[name]).run(
            fetch_command(h.paths(record.name).run_dir, where, step), timeout=FETCH_TIMEOUT)
        if result.exit_code == NOT_THERE:
            misses.append(f"{name}: {result.error_line()}")
            continue
        if not result.ok:
            raise FetchError(f"{name}: fetching failed: {result.error_line()}")
        directory, files = parse_answer(result.stdout)
        # The config names the controller's model, not the node's copy (workloads/finetune).
        files[ADAPTER_CONFIG] = workload.adapters_config(files[ADAPTER_CONFIG])
        return Fetched(name, directory, step_of(files), write_out(files, out), out)
    asked = (f"{where}/{protocol.checkpoint_name(step)}" if step is not None
             else f"a checkpoint in {where}/")
    raise FetchError(f"no host of job {record.name!r} has {asked}: " + "; ".join(misses))
