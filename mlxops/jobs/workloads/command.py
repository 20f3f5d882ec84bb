"""``command:``: the user's own program, run as every rank (docs/job-file.md).

Words, or one command line split as a shell would split it (never run by one); a leading
``python``/``python3`` becomes the node's interpreter, as ``mlx.launch --python`` does. It
runs in the job's synced ``workdir:`` when the job has one, else in its run directory. Its
batch, data and checkpoints are its own: ``balance:``, ``data:``, ``plan``, ``export`` and
``fetch`` do not apply.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlxops.errors import bad_input
from mlxops.jobs.data import DataSpec
from mlxops.jobs.workloads.base import NodePlacement, RankPlan, Workload

KIND = "command"
PYTHONS = ("python", "python3")


def command_words(path: Path, command: Any) -> tuple[str, ...]:
    if isinstance(command, str):
        try:
            words = shlex.split(command)
        except ValueError as exc:
            raise bad_input(path, KIND, f"cannot split into words: {exc}") from None
    elif isinstance(command, list) and all(isinstance(w, (str, int, float)) for w in command):
        words = [str(w) for w in command]
    else:
        raise bad_input(path, KIND, "must be a list of words or one command line")
    if not words:
        raise bad_input(path, KIND, "is empty")
    return tuple(words)


@dataclass(frozen=True)
class CommandWorkload(Workload):
    argv: tuple[str, ...]

    kind = KIND
    what = "your own command"
    summary = "your own program"
    takes_workdir = True

    @classmethod
    def parse(cls, path: Path, section: Any, *, data: DataSpec | None = None
              ) -> CommandWorkload:
        return cls(command_words(path, section))

    def to_record(self) -> list[str]:
        return list(self.argv)

    @classmethod
    def from_record(cls, data: Any) -> CommandWorkload:
        if not isinstance(data, list) or not data or not all(isinstance(w, str) for w in data):
            raise ValueError(f"job.{KIND}: not a list of words: {data!r}")
        return cls(tuple(data))

    def rank_plan(self, node: NodePlacement) -> RankPlan:
        argv = list(self.argv)
        if argv[0] in PYTHONS:
            argv[0] = node.python  # the node's absolute interpreter, as mlx.launch --python
        cwd = node.paths.workdir() if node.workdir else node.paths.run_dir
        return RankPlan(cwd=cwd, argv={r.rank: argv for r in node.here})
