"""Benchmark: each command's start-up, up to its first connection, against the floor.

The floor is what any Python CLI built on click pays: ``python -c "import click"`` (a bare
``python -c pass`` is printed too). Each command runs as a person types it, through
``python -m mlxops.cli.startup`` (the CLI, ended where it would first connect: see
that module), in the same run, interleaved with the floor, so that a busy machine slows
both alike. The target (issue 21): every command within 0.2 s, or within 2x the floor.

    .venv/bin/python benchmarks/startup.py [--repeat 15]

No root, no sandbox, no network: the inventory names addresses nothing connects to.
Figures are the median of ``--repeat`` wall times; CPU (user + sys) beside them.

``mlxops check`` runs its checks in a pytest session, so pytest's own start-up is its
floor: ``python -c "import pytest"`` and an empty session with the plugins check loads
(testinfra's, plugin autoload off) are timed beside the commands, without a target.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mlxops.checks.run import testinfra_entry_point
from mlxops.cli.startup import write_sample_files

TARGET_SECONDS, TARGET_RATIO = 0.2, 2.0

FLOOR = {"python -c pass": ["-c", "pass"], "python -c 'import click'": ["-c", "import click"]}
#: An empty pytest session as ``mlxops check`` configures one (mlxops.checks.run), on the
#: empty directory ``empty/``: pytest's part of check's start-up.
EMPTY_SESSION = (
    "import os, sys, pytest; os.environ['PYTEST_DISABLE_PLUGIN_AUTOLOAD'] = '1'; "
    "sys.exit(pytest.main(['-p', 'no:cacheprovider', '-p', 'no:terminal', '-p', "
    "sys.argv[1], '-c', os.devnull, '--rootdir', 'empty', 'empty']))")
DRIVER = ["-m", "mlxops.cli.startup"]
COMMANDS = {
    "mlxops --help": ["--help"],
    "mlxops status --help": ["status", "--help"],
    "mlxops status (no jobs)": ["status"],
    "mlxops launch missing.yml (exit 2)": ["launch", "missing.yml"],
    "mlxops run INV -- true": ["run", "inventory.yml", "--", "true"],
    "mlxops trust INV": ["trust", "inventory.yml"],
    "mlxops provision INV": ["provision", "inventory.yml"],
    "mlxops launch JOB": ["launch", "job.yml"],
    "mlxops plan JOB": ["plan", "job.yml"],
    "mlxops bench INV": ["bench", "inventory.yml"],
    "mlxops check INV": ["check", "inventory.yml"],
}


def timed(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU (user + sys) seconds of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mlxops-startup-") as tmp:
        d = Path(tmp)
        write_sample_files(d)
        (d / "empty").mkdir()
        env = {**os.environ, "MLXOPS_HOME": str(d / "home")}
        env.pop("MLXOPS_DEBUG", None)
        pytest_floor = {
            "python -c 'import pytest'": ["-c", "import pytest"],
            "empty pytest session (check's)": ["-c", EMPTY_SESSION, testinfra_entry_point()],
        }
        runs = {**{k: [sys.executable, *v] for k, v in FLOOR.items()},
                **{k: [sys.executable, *v] for k, v in pytest_floor.items()},
                **{k: [sys.executable, *DRIVER, *v] for k, v in COMMANDS.items()}}
        for argv in runs.values():  # untimed: compiled bytecode, warm page cache
            timed(argv, d, env)
        walls: dict[str, list[float]] = {k: [] for k in runs}
        cpus: dict[str, list[float]] = {k: [] for k in runs}
        for _ in range(args.repeat):  # interleaved: load on a shared machine hits all alike
            for name, argv in runs.items():
                wall, cpu = timed(argv, d, env)
                walls[name].append(wall)
                cpus[name].append(cpu)
    wall = {k: statistics.median(v) for k, v in walls.items()}
    cpu = {k: statistics.median(v) for k, v in cpus.items()}
    floor = wall["python -c 'import click'"]
    print(f"start-up to the first connection, median of {args.repeat} "
          f"(target: <= {TARGET_SECONDS} s or <= {TARGET_RATIO:g}x the click floor)\n")
    print(f"{'command':38} {'wall s':>7} {'cpu s':>7} {'x floor':>8}  target")
    worst = 0.0
    for name in runs:
        ratio = wall[name] / floor
        met = ""
        if name in COMMANDS:
            ok = wall[name] <= TARGET_SECONDS or ratio <= TARGET_RATIO
            worst = max(worst, ratio)
            met = "met" if ok else "MISSED"
        print(f"{name:38} {wall[name]:7.3f} {cpu[name]:7.3f} {ratio:7.2f}x  {met}")
    print(f"\nworst command: {worst:.2f}x the floor ({floor:.3f} s); "
          f"load average at the end: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
