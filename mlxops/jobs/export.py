"""``mlxops export``: a job's checkpoint, converted where it lies, copied to the controller.

The conversion (:mod:`mlxops.trainer.export`, synced with the trainer) runs on the node
that holds the checkpoint, the job's first host (rank 0 writes them), into a temporary
directory there; one tar stream of the result comes back (base64 on the wire: a command's
output is text) and is unpacked into the local directory. The temporary directory goes
whatever happens. The code is synced first, as pre-flight does, so a node provisioned before
the exporter existed has it.
"""

from __future__ import annotations

import base64
import io
import json
import tarfile
from pathlib import Path

from mlxops import shell
from mlxops.errors import MlxopsError, UserError
from mlxops.jobs.code import sync_code
from mlxops.jobs.record import inventory_hosts, load_record
from mlxops.node.protocol.serve import EXPORT_ARCHES, ExportAnswer, export_args
from mlxops.transport import Connector
from mlxops.transport.nodecmd import HELPER_ENV

#: What the node command prints before the archive: one JSON line (the exporter's answer).
_ARCHIVE_MARK = "--- archive ---"


def export_command(python: str, code_dir: str, run_dir: str, *, step: int | None,
                   best: bool, arch: str) -> str:
    """Convert into a temporary directory, print the answer, a mark, then the base64'd
    tar of the directory; the directory is removed whatever the exit."""
    convert = shell.with_env(
        [python, *export_args(run_dir=run_dir, step=step, best=best, arch=arch)],
        {"PYTHONPATH": code_dir, **HELPER_ENV}) + ' --out "$tmp"'
    return (f'tmp=$(mktemp -d) || exit 1; {{ {convert} && printf "%s\\n" '
            f'{shell.quote(_ARCHIVE_MARK)} && tar -cf - -C "$tmp" . | base64; }}; '
            'code=$?; rm -rf "$tmp"; exit "$code"')


def export_run(name: str, out: Path, connector: Connector, *, step: int | None = None,
               best: bool = False, arch: str = EXPORT_ARCHES[0]) -> ExportAnswer:
    """Export job ``name``'s newest checkpoint (or ``step``'s, or its best) into ``out``;
    the exporter's
    answer (``checkpoint``: the node's path; ``out``: the local directory)."""
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
    result = conn.run(export_command(first.python, paths.code, paths.run_dir, step=step,
                                     best=best, arch=arch), timeout=3600)
    if not result.ok:
        line = result.error_line()
        if result.exit_code == 2:  # the exporter's own refusal: bad input, one line
            raise UserError(f"{first.name}: {line.split(': ', 1)[-1]}")
        raise MlxopsError(f"{first.name}: export failed: {line}")
    answer, _, payload = result.stdout.partition(_ARCHIVE_MARK + "\n")
    done = ExportAnswer.from_dict(json.loads(answer.strip().splitlines()[-1]))
    out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(payload)), mode="r:") as tar:
        tar.extractall(out, filter="data")
    done.out = str(out)
    return done
