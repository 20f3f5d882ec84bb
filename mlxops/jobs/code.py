"""What code a job needs on each node, and getting it there (only what changed travels)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from mlxops.jobs.placement import NodePaths
from mlxops.jobs.spec import JobSpec
from mlxops.sync import Ignore, SyncReport, bundle, sync_files
from mlxops.transport import Connection


def code_bundle(spec: JobSpec) -> tuple[dict[str, Path], list[str], Ignore]:
    """The bundled code (trainer + node helpers) and the job's workdir, as ``code/`` holds it.

    The same bundle as provision's ``sync`` task, so the two never undo each other.
    """
    return bundle(spec.workdir, spec.name if spec.workdir else None)


def sync_code(conn: Connection, paths: NodePaths, spec: JobSpec, python: str, *,
              remote: Mapping[str, tuple[str, int]] | None = None) -> SyncReport:
    """Make ``<root>/code`` hold the bundle; ``remote``: its manifest, if already fetched."""
    files, roots, ignore = code_bundle(spec)
    return sync_files(conn, files, paths.code, roots=roots, ignore=ignore, python=python,
                      remote=remote)
