"""Where a job's supervisor lives on its host, and the names that choose it: the layout
the ``supervisor`` provision task (:mod:`mlxops.tasks.supervisor`) makes and the jobs'
supervision (:mod:`mlxops.jobs.supervisor`, :mod:`mlxops.jobs.supervising`) uses.

Policy (docs/supervisor.md): one directory per host, ``<mlxops_root>/supervisor``, with the
venv the task makes (``venv/bin/python``), the watchdog's home and one copy of the
controller's code per job. Standard library only, beside the other rules that know of no
host, so that the task (a lower room than the jobs) reads the same layout.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

CONTROLLER = "controller"
VARIABLE = "mlxops_supervisor"
#: Set in the environment of a watchdog started on a node: the host it runs on. A watchdog
#: whose job names another supervisor (or one on a node, when this is unset) only follows.
ENV_HOST = "MLXOPS_SUPERVISOR_HOST"
SITE_DIR = "supervisor"                 # under mlxops_root
KEY_FILE = "~/.ssh/mlxops_supervisor"   # the supervisor host's own key (provision task)
#: What the controller's code imports beyond the stdlib, mlx and numpy (pyproject.toml's
#: dependencies, by import name): pre-flight checks the supervisor's venv has them.
IMPORTS = ("fabric", "paramiko", "click", "jinja2", "yaml", "rich", "prometheus_client")


@dataclass(frozen=True)
class Site:
    """Where a job's supervisor lives on its host: ``dir`` is ``<mlxops_root>/supervisor``,
    absolute (as the node resolved it)."""

    host: str
    dir: str
    job: str

    @property
    def home(self) -> str:
        return posixpath.join(self.dir, "home")

    @property
    def lib(self) -> str:
        """The controller's code, one copy per job: a resume replacing one job's never
        pulls the modules from under another job's watchdog on the same host."""
        return posixpath.join(self.dir, "jobs", self.job, "lib")

    @property
    def python(self) -> str:
        return posixpath.join(self.dir, "venv", "bin", "python")

    @property
    def inventory(self) -> str:
        return posixpath.join(self.dir, "jobs", self.job, "inventory.yml")

    @property
    def known_hosts(self) -> str:
        return posixpath.join(self.dir, "known_hosts")

    @property
    def job_dir(self) -> str:
        return posixpath.join(self.home, "jobs", self.job)

    @property
    def lock(self) -> str:
        return posixpath.join(self.job_dir, "watch.lock")

    @property
    def log(self) -> str:
        return posixpath.join(self.job_dir, "supervisor.log")

    @property
    def label(self) -> str:
        """The launchd label and systemd unit name (a job name is [A-Za-z0-9._-])."""
        return f"org.mlxops.watch.{self.job}"

    def env(self) -> dict[str, str]:
        return {"MLXOPS_HOME": self.home, "PYTHONPATH": self.lib, ENV_HOST: self.host,
                "PYTHONUNBUFFERED": "1"}

    def argv(self) -> list[str]:
        return [self.python, "-m", "mlxops", "watch", self.job]
