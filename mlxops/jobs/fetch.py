"""``mlxops fetch``: a fine-tuning job's adapters, from a node to the controller.

What comes back is what mlx-lm reads (``mlx_lm.generate --adapter-path DIR``,
``mlx_lm.fuse --adapter-path DIR``): ``adapters.safetensors`` (the trainable weights: the
adapters of ``lora`` / ``dora``, the trained blocks of ``full``) and
``adapter_config.json``, as the run wrote them into a checkpoint
(:mod:`mlxops.finetune.model`). Which checkpoint:

* by default the newest: :func:`mlxops.node.protocol.layout.newest_checkpoint` of
  ``<run>/ckpt``, chosen on the node (the rule is written once, there);
* ``best``: the same under ``<run>/best/``, where the run keeps the checkpoint of the
  lowest validation loss;
* a step: ``<run>/ckpt/step-<N>/``, when complete.

The node's ``send`` command answers with the chosen directory and streams its files
(:mod:`mlxops.jobs.download`: never whole in memory). The hosts are asked in rank order
(rank 0's first) until one has it; every node writes its checkpoints, so the first normally
does. Over the job's verified connections, as every command.

A job over pipeline stages (``finetune.stages``, docs/pipeline.md) has each stage's part
of the adapters on the stage's own host, in ``<run>/ckpt/stage-<s>/``: the newest complete
checkpoint of stage 0 is chosen there, the same step's is asked of every other stage, and
their ``adapters.safetensors`` (each under the whole model's names) are assembled into
one (:func:`mlxops.finetune.pipeline.assemble`) with stage 0's ``adapter_config.json``.
Such a run validates nothing, so it has no ``best``.

The output directory is written as **one set**: the files go into a temporary directory
beside it, which is renamed into place once whole; a reader of ``DIR`` sees the previous
set or the new one, never the adapters of one step with the config of another. ``DIR``
therefore holds the fetched files only (anything else there: bad input, exit 2).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from mlxops.errors import MlxopsError, UserError
from mlxops.jobs.download import Downloaded, DownloadError, download, send_command
from mlxops.jobs.record import JobRecord, inventory_hosts
from mlxops.node import protocol
from mlxops.node.protocol.send import send_checkpoint_args
from mlxops.transport import Connector

ADAPTERS, ADAPTER_CONFIG = "adapters.safetensors", "adapter_config.json"
#: What is fetched into the output directory.
FETCHED = (ADAPTERS, ADAPTER_CONFIG)
#: Seconds without a byte after which a fetch is given up.
FETCH_TIMEOUT = 600.0


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


def check_out(out: Path) -> None:
    """``-o DIR`` before any host is asked: absent, or a directory of fetched files only
    (it is replaced as a whole)."""
    if not out.exists():
        return
    if not out.is_dir():
        raise UserError(f"-o: {out} exists and is not a directory")
    other = sorted(p.name for p in out.iterdir() if p.name not in FETCHED)
    if other:
        raise UserError(f"-o: {out} holds {other[0]}: fetch replaces the directory as a "
                        "whole (adapters and config as one set); choose a directory of its "
                        "own")


def place(tmp: Path, out: Path) -> None:
    """Rename the whole set ``tmp`` into place as ``out`` (a previous set is moved aside
    first, then removed: ``out`` is never a mix of two)."""
    old = None
    if out.exists():
        old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.old-"))
        os.replace(out, old / out.name)
    os.replace(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def fetch(record: JobRecord, connector: Connector, out: Path, *, best: bool = False,
          step: int | None = None) -> Fetched:
    """Bring the chosen checkpoint's adapters of job ``record`` into ``out``."""
    workload = record.workload
    if workload is None or not workload.adapters:
        raise UserError(f"job {record.name!r} is not a fine-tuning job (finetune:): it has "
                        "no adapters to fetch")
    where, step = which_dir(best, step)
    check_out(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if workload.stages is not None:
        if best:
            raise UserError(f"--best: job {record.name!r} runs over pipeline stages, which "
                            "validate nothing: it has no best checkpoint")
        return _fetch_stages(record, connector, out, step)
    hosts = inventory_hosts(record)
    order = list(dict.fromkeys(r.host for r in sorted(record.ranks, key=lambda r: r.rank)))
    misses = []
    for name in order:
        tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
        try:
            got = _download(record, connector, hosts, name, where, step, tmp)
            if got.answer.missing:
                misses.append(f"{name}: {got.answer.missing}")
                continue
            # The config names the controller's model, not the node's copy
            # (workloads/finetune.py); rewritten before the set is renamed into place.
            config = tmp / ADAPTER_CONFIG
            config.write_bytes(workload.adapters_config(config.read_bytes()))
            got.written[ADAPTER_CONFIG] = config.stat().st_size
            tmp.chmod(0o755 & ~_umask())
            place(tmp, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return Fetched(name, got.answer.directory, got.answer.step, got.written, out)
    asked = (f"{where}/{protocol.checkpoint_name(step)}" if step is not None
             else f"a checkpoint in {where}/")
    raise FetchError(f"no host of job {record.name!r} has {asked}: " + "; ".join(misses))


def _fetch_stages(record: JobRecord, connector: Connector, out: Path, step: int | None
                  ) -> Fetched:
    """Every stage's adapters of one step, from its own host, assembled (module doc)."""
    from mlxops.finetune.pipeline import assemble  # mlx: only a stages job needs it

    workload = record.workload
    hosts = inventory_hosts(record)
    ranks = sorted(record.ranks, key=lambda r: r.rank)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
    try:
        files, config = [], b""
        for r in ranks:
            part = tmp / f"stage-{r.rank}"
            part.mkdir()
            got = _download(record, connector, hosts, r.host, f"{protocol.CKPT_DIR}/"
                            f"stage-{r.rank}", step, part)
            if got.answer.missing:
                raise FetchError(f"{r.host}: stage {r.rank}: {got.answer.missing}")
            if r.rank == 0:   # every stage takes the step stage 0 has
                step, first, config = got.answer.step, got, (part / ADAPTER_CONFIG).read_bytes()
            files.append(part / ADAPTERS)
        whole = assemble(files, tmp / "whole",
                         json.loads(workload.adapters_config(config)))
        whole.chmod(0o755 & ~_umask())
        written = {p.name: p.stat().st_size for p in sorted(whole.iterdir())}
        place(whole, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return Fetched(ranks[0].host, first.answer.directory, step, written, out)


def _download(record: JobRecord, connector: Connector, hosts: dict, name: str, where: str,
              step: int | None, into: Path) -> Downloaded:
    """Host ``name``'s checkpoint of ``step`` (its newest if None) under ``where`` of the
    job's run directory, its adapters' files streamed into ``into``; a download that failed
    or ended before the node's answer is :class:`FetchError`. The answer may still say the
    host has no such checkpoint (``answer.missing``): the caller decides what that means."""
    h = record.host(name)
    paths = h.paths(record.name)
    command = send_command(h.python, paths.code, send_checkpoint_args(
        paths.run_dir, where, FETCHED, step=step))
    try:
        got, result = download(connector.connect(hosts[name]), command, into,
                               timeout=FETCH_TIMEOUT)
    except DownloadError as exc:
        raise FetchError(str(exc)) from None
    if got.answer is None:
        raise FetchError(f"{name}: fetching failed: {result.error_line()}")
    return got


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask

