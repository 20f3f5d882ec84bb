"""Where the controller keeps its jobs: a directory per job under the controller's home
(``<controller home>/jobs/<name>/``), the job's record in it (``record.json``).

Apart from :mod:`mlxops.jobs.record`, which reads and writes the record and imports the
whole job schema to do so: listing the jobs needs their directories only (``mlxops status``
with no jobs answers from here, and a person types it often; the dashboard's index).
"""

from __future__ import annotations

from pathlib import Path

from mlxops.paths import controller_home

RECORD_FILE = "record.json"


def job_dir(name: str) -> Path:
    return controller_home() / "jobs" / name


def record_path(name: str) -> Path:
    return job_dir(name) / RECORD_FILE


def list_jobs() -> list[str]:
    """The names of the jobs that have a record, sorted."""
    root = controller_home() / "jobs"
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if (p / RECORD_FILE).is_file())
