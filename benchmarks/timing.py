"""One timed run of a command, for the benchmarks that time mlxops' CLI end to end
(``init.py``, ``provision_noop.py``): wall seconds from start to exit, and what it printed.

A run that fails ends the benchmark with its exit code and the last of its output: a
failed run's time is no figure to print beside the alternative's.
"""

from __future__ import annotations

import subprocess
import sys
import time


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, str]:
    """Seconds ``argv`` took (no stdin), and its stdout; exits if it failed."""
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env,
                          stdin=subprocess.DEVNULL)
    took = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{' '.join(argv[:6])} ... failed ({proc.returncode}):\n"
                 f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return took, proc.stdout
