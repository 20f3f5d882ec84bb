"""Task ``sync``: the bundled trainer (and a job's workdir) to ``mlxops_root/code/``.

Node layout: ``code/mlxops/__init__.py`` + ``code/mlxops/trainer/`` + ``code/mlxops/node/``
(so that
``PYTHONPATH=<root>/code python -m mlxops.trainer`` works) and, with ``workdir`` and
``job``, ``code/jobs/<job>/``. One manifest command and at most one transfer per host
(:mod:`mlxops.sync`); other jobs' directories under ``code/jobs/`` are left alone.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mlxops import paths
from mlxops.hostfacts import HostFacts
from mlxops.ignore import Ignore
from mlxops.node.protocol.layout import CODE_DIR, job_code_path
from mlxops.sync import (
    DEFAULT_EXCLUDES,
    PY_MANIFEST,
    SyncError,
    collect,
    parse_manifest,
    sync_files,
)
from mlxops.tasks.base import Outcome, PythonRead, TaskContext, task

_JOB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
MANIFEST = "manifest"  # the key of the node's manifest among the task's reads
# The manifest of mlxops.sync, its base directory as the node's shell would expand it.
MANIFEST_SOURCE = ("import os, sys\nsys.argv[1] = os.path.expanduser(sys.argv[1])\n"
                   + PY_MANIFEST)


def code_path(host: Any) -> str:
    return posixpath.join(host.root, CODE_DIR)


def bundle(workdir: Path | None = None, job: str | None = None
           ) -> tuple[dict[str, Path], list[str], Ignore]:
    """``(files, roots, ignore)`` of what ``code/`` holds: the trainer, and a job's workdir."""
    files, ignore = collect(paths.trainer_dir(), DEFAULT_EXCLUDES, prefix="mlxops/trainer")
    # The node-side helpers of jobs (spawn, status, stop, logs) travel with the trainer.
    node_files, node_ignore = collect(paths.node_dir(), DEFAULT_EXCLUDES, prefix="mlxops/node")
    files.update(node_files)
    ignore.extend(node_ignore)
    # Fine-tuning (python -m mlxops.finetune) runs beside the trainer, on its modules.
    ft_files, ft_ignore = collect(paths.trainer_dir().parent / "finetune", DEFAULT_EXCLUDES,
                                  prefix="mlxops/finetune")
    files.update(ft_files)
    ignore.extend(ft_ignore)
    files["mlxops/__init__.py"] = paths.trainer_dir().parent / "__init__.py"
    # The excludes above apply under mlxops/trainer/ and mlxops/node/ only; the
    # mlxops/__pycache__/ a node's Python writes beside __init__.py is no difference either
    # (else every provision after a job deletes it again, and never reports ok).
    ignore.extend(Ignore(DEFAULT_EXCLUDES))
    roots = sync_roots(workdir, job)
    if workdir is not None:
        job_files, job_ignore = collect(Path(workdir), DEFAULT_EXCLUDES, prefix=roots[-1])
        files.update(job_files)
        ignore.extend(job_ignore)
    return files, roots, ignore


def sync_roots(workdir: object, job: str | None) -> list[str]:
    """The directories under ``code/`` the task owns: ``mlxops``, and the job's with a
    workdir."""
    if workdir is None:
        return ["mlxops"]
    if not job or not _JOB_NAME.match(job):
        raise ValueError(f"job name {job!r}: want letters, digits, '.', '_' or '-'")
    return ["mlxops", job_code_path(job)]


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
    if job is not None and not (isinstance(job, str) and _JOB_NAME.match(job)):
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
