"""What code a job needs on each node, and getting it there (only what changed travels)."""

from __future__ import annotations

from mlxops.jobs.placement import NodePaths
from mlxops.jobs.spec import JobSpec
from mlxops.sync import SyncReport, sync_files
from mlxops.tasks.sync import bundle
from mlxops.transport import Connection


def sync_code(conn: Connection, paths: NodePaths, spec: JobSpec, python: str) -> SyncReport:
    """The bundled code (trainer + node helpers), and the job's workdir, to ``<root>/code``.

    The same bundle as provision's ``sync`` task, so the two never undo each other.
    """
    files, roots, ignore = bundle(spec.workdir, spec.name if spec.workdir else None)
    return sync_files(conn, files, paths.code, roots=roots, ignore=ignore, python=python)
