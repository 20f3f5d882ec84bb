"""Task ``sync``: the bundled trainer (and a job's workdir) to ``mlxops_root/code/``.

Node layout: ``code/mlxops/__init__.py`` + ``code/mlxops/trainer/`` + ``code/mlxops/node/``
(so that
``PYTHONPATH=<root>/code python -m mlxops.trainer`` works) and, with ``workdir`` and
``job``, ``code/jobs/<job>/``. One manifest command and at most one transfer per host
(:mod:`mlxops.sync`, which also defines the bundle: :func:`mlxops.sync.bundle`); other
jobs' directories under ``code/jobs/`` are left alone.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mlxops.hostfacts import HostFacts
from mlxops.node.protocol.layout import CODE_DIR, job_code_path
from mlxops.sync import (
    JOB_NAME,
    PY_MANIFEST,
    SyncError,
    bundle,
    parse_manifest,
    sync_files,
    sync_roots,
)
from mlxops.tasks.base import Outcome, PythonRead, TaskContext, task

MANIFEST = "manifest"  # the key of the node's manifest among the task's reads
# The manifest of mlxops.sync, its base directory as the node's shell would expand it.
MANIFEST_SOURCE = ("import os, sys\nsys.argv[1] = os.path.expanduser(sys.argv[1])\n"
                   + PY_MANIFEST)


def code_path(host: Any) -> str:
    return posixpath.join(host.root, CODE_DIR)


def sync_reads(host: Any, args: Mapping[str, Any]) -> dict[str, PythonRead]:
    """The node's manifest of what the task owns (a JSON answer), by ``mlxops_python``."""
    roots = sync_roots(args.get("workdir"), args.get("job"))
    return {MANIFEST: PythonRead(MANIFEST_SOURCE, (code_path(host), *roots))}


def prefetched_manifest(ctx: TaskContext) -> dict[str, tuple[str, int]] | None:
    answer = ctx.prefetched(MANIFEST)
    try:
        return parse_manifest(answer, python=True) if answer is not None else None
    except (ValueError, IndexError, KeyError, TypeError):
        return None  # not a manifest after all: the task lists the node itself


def node_python(facts: HostFacts | None) -> str | None:
    return facts.python.path if facts else None


def check_args(args: Mapping[str, Any]) -> None:
    """Refuse bad playbook arguments before connecting (the engine calls it at load)."""
    job, workdir = args.get("job"), args.get("workdir")
    if job is not None and not (isinstance(job, str) and JOB_NAME.match(job)):
        raise ValueError(f"job: want letters, digits, '.', '_' or '-', got {job!r}")
    if workdir is not None and not job:
        raise ValueError("job: needed with workdir (the node directory is "
                         f"{CODE_DIR}/{job_code_path('<job>')})")


@task("sync", args=["workdir", "job"], read=sync_reads)
def sync_task(ctx: TaskContext, args: Mapping[str, Any]) -> Outcome:
    workdir = args.get("workdir")
    try:
        files, roots, ignore = bundle(Path(workdir) if workdir else None, args.get("job"))
        report = sync_files(ctx.conn, files, code_path(ctx.host), roots=roots, ignore=ignore,
                            check=ctx.check, python=node_python(ctx.facts),
                            remote=prefetched_manifest(ctx))
    except (SyncError, ValueError) as exc:
        return Outcome.failed(str(exc))
    data = {"added": report.added, "changed": report.changed, "deleted": report.deleted,
            "bytes_sent": report.bytes_sent}
    if not report.has_changes:
        return Outcome.ok(f"{len(files)} files up to date", **data)
    verb = "would be " if ctx.check else ""
    return Outcome.changed(f"{verb}{report.summary()}",
                           diff=report.diff() if ctx.diff else "", **data)


sync_task.check_args = check_args  # type: ignore[attr-defined]
