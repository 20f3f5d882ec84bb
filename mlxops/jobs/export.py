"""``mlxops export``: a job's checkpoint, converted where it lies, copied to the controller.

The conversion (:mod:`mlxops.trainer.export`, synced with the trainer) runs on the node
that holds the checkpoint, the job's first host (rank 0 writes them; a pipeline run's
other stages' checkpoints of the step are copied there first, :mod:`.ckptmove`, and
merged by name), into a temporary
directory there, and chooses the checkpoint by the one rule of
:func:`mlxops.node.protocol.layout.newest_checkpoint`. It prints its answer line; the node's
``send`` command then streams the directory (:mod:`mlxops.jobs.download`: never whole in the
controller's memory) into a temporary directory beside the local one, renamed into place
once whole. The node's temporary directory goes whatever happens. The code is synced
first, as pre-flight does, so a node provisioned before the exporter existed has it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from mlxops import shell
from mlxops.errors import MlxopsError, UserError
from mlxops.jobs.code import sync_code
from mlxops.jobs.download import DownloadError, download, send_command
from mlxops.jobs.record import JobRecord, inventory_hosts, load_record
from mlxops.node.protocol.send import SEND
from mlxops.node.protocol.serve import EXPORT_ARCHES, ExportAnswer, export_args
from mlxops.transport import Connector
from mlxops.transport.nodecmd import HELPER_ENV

#: Seconds without a byte (the conversion prints nothing until done) before giving up.
EXPORT_TIMEOUT = 3600.0


def export_command(python: str, code_dir: str, run_dir: str, *, step: int | None,
                   best: bool, arch: str) -> str:
    """Convert into a temporary directory (the exporter prints its answer line), then send
    the directory; the directory is removed whatever the exit."""
    convert = shell.with_env(
        [python, *export_args(run_dir=run_dir, step=step, best=best, arch=arch)],
        {"PYTHONPATH": code_dir, **HELPER_ENV}) + ' --out "$tmp"'
    send = send_command(python, code_dir, [SEND]) + ' --dir "$tmp"'
    return (f'tmp=$(mktemp -d) || exit 1; {{ {convert} && {send}; }}; '
            'code=$?; rm -rf "$tmp"; exit "$code"')


def export_run(name: str, out: Path, connector: Connector, *, step: int | None = None,
               best: bool = False, arch: str = EXPORT_ARCHES[0]) -> ExportAnswer:
    """Export job ``name``'s newest checkpoint (or ``step``'s, or its best) into ``out``;
    the exporter's answer (``checkpoint``: the node's path; ``out``: the local directory)."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"-o: {out} exists and is not an empty directory")
    record = load_record(name)
    spec = record.job_spec()
    if not spec.workload.exports:
        # The bundled trainer's runs are converted, fine-tuning runs' fused (a job of
        # either writes checkpoints); a command's or a server's are not ours to read.
        raise UserError(f"job {name!r} runs {spec.workload.what}: no checkpoint of the "
                        "bundled trainer or of fine-tuning to export")
    first = record.host(record.ranks[0].host)
    host = inventory_hosts(record)[first.name]
    conn = connector.connect(host)
    paths = first.paths(name)
    sync_code(conn, paths, spec, first.python)
    if spec.workload.one_rank_per_host and spec.workload.spreads_checkpoints() and not best:
        step = _stages_here(record, first.name, step, connector)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
    try:
        try:
            got, result = download(conn, export_command(
                first.python, paths.code, paths.run_dir, step=step, best=best, arch=arch),
                tmp, timeout=EXPORT_TIMEOUT)
        except DownloadError as exc:
            raise MlxopsError(f"export failed: {exc}") from None
        if not result.ok:
            line = result.error_line()
            if result.exit_code == 2:  # the exporter's own refusal: bad input, one line
                raise UserError(f"{first.name}: {line.split(': ', 1)[-1]}")
            raise MlxopsError(f"{first.name}: export failed: {line}")
        if got.answer is None or got.answer.missing or not got.before:
            raise MlxopsError(f"{first.name}: export failed: no exporter's answer before "
                              "the files")
        done = ExportAnswer.from_dict(json.loads(got.before[-1]))
        if out.exists():
            out.rmdir()  # empty, as checked
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    done.out = str(out)
    return done


def _stages_here(record: JobRecord, first: str, step: int | None, connector: Connector) -> int:
    """A pipeline run's stage checkpoints of ``step`` (the newest one whose stages all
    answer, when None) copied onto ``first``, where the exporter merges them by name
    (:mod:`mlxops.jobs.ckptmove`); the step chosen. Refused in one line when no node that
    answers holds some stage's."""
    from mlxops.jobs.ckptmove import MoveError, Node, bring_together
    from mlxops.jobs.ckptplan import PlanError

    hosts = inventory_hosts(record)
    nodes = [Node(hosts[h.name], h.root, h.python) for h in record.hosts]
    try:
        moved = bring_together(nodes, [first], record.name,
                               None if step is None else {step}, connector, None)
    except PlanError as exc:
        raise UserError(f"export of {record.name!r}: {exc}") from None
    except MoveError as exc:
        raise MlxopsError(f"export failed: {exc}") from None
    if moved.step is None:
        raise UserError(f"job {record.name!r}: no stage checkpoint to export")
    return moved.step
