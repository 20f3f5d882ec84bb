"""Run one command as N ring ranks on this machine: the trainer's tests and benchmark.

It does what ``mlx.launch --hosts 127.0.0.1,... --backend ring`` does for local ranks: one
``127.0.0.1:<port>`` per rank in a JSON hostfile, and ``MLX_RANK`` and ``MLX_HOSTFILE``
in each rank's environment (the same variables mlxops gives its ranks on nodes). It does
not copy mlx.launch's I/O loop. In mlx 0.32 that loop puts every rank's stdin pipe into
its ``select`` write set, even when it has nothing to write. The pipe is always writable,
so the launcher spins a whole core for as long as the ranks run. On a 2-core machine
that is a third of the CPU taken from the ranks being measured. Here each rank's output
goes to a file and its stdin is /dev/null.

Standard library only. It lives outside the trainer package, which is synced to every node:
no node runs it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path

from mlxops.node.blas import thread_env, usable_cpus
from mlxops.node.protocol.rankenv import MLX_HOSTFILE, MLX_RANK

#: How long the other ranks get to print their last lines after one has failed, before
#: they are killed (a rank whose peer died waits in a collective forever).
FAILURE_GRACE = 2.0


def openblas_env(library: str, ranks: int) -> dict[str, str]:
    """What mlxops gives each of ``ranks`` ranks on this machine whose OpenBLAS is
    ``library``: it preloaded, and its threads as :func:`mlxops.node.blas.thread_env` sets
    them for this machine's usable CPUs (docs/job-file.md, "What each rank gets")."""
    return {"LD_PRELOAD": library, **thread_env(usable_cpus(), ranks)}


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` ports nothing listens on now (the kernel's choice, so parallel runs differ)."""
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in socks]


def run_ranks(cmd: Sequence[str], ranks: int, *, env: Mapping[str, str] | None = None,
              cwd: str | Path | None = None, timeout: float = 300.0,
              preload: str | None = None) -> subprocess.CompletedProcess:
    """Run ``cmd`` as ``ranks`` ring ranks on 127.0.0.1 and wait for all of them.

    Returns one ``CompletedProcess``: ``returncode`` is the first failed rank's code (or
    0), and ``stdout``/``stderr`` hold every rank's output in rank order. When one rank
    fails, the others are killed :data:`FAILURE_GRACE` seconds later. ``timeout`` kills
    every rank and raises ``subprocess.TimeoutExpired``, as ``subprocess.run`` does.
    ``preload``: a library put after the environment's ``LD_PRELOAD`` (the tests give the
    one sandbox nodes preload, :mod:`mlxops.sandbox.nospin`: ranks that share this
    machine's cores wait for a late peer instead of polling; benchmarks give none).
    """
    if ranks < 2:
        raise ValueError(f"run_ranks starts 2 or more ranks, not {ranks}")
    base = dict(os.environ if env is None else env)
    if preload:
        base["LD_PRELOAD"] = ":".join(p for p in (base.get("LD_PRELOAD"), preload) if p)
    with tempfile.TemporaryDirectory(prefix="mlxops-ranks-") as d:
        tmp = Path(d)
        hostfile = tmp / "hostfile.json"
        hostfile.write_text(json.dumps([[f"127.0.0.1:{p}"] for p in free_ports(ranks)]))
        procs, files = [], []
        for rank in range(ranks):
            out = open(tmp / f"rank-{rank}.out", "w+")  # noqa: SIM115 - closed below
            err = open(tmp / f"rank-{rank}.err", "w+")  # noqa: SIM115
            files += [out, err]
            rank_env = {**base, MLX_RANK: str(rank), MLX_HOSTFILE: str(hostfile)}
            procs.append(subprocess.Popen(
                list(cmd), cwd=cwd, env=rank_env, stdin=subprocess.DEVNULL, stdout=out,
                stderr=err, start_new_session=True))
        try:
            code = _wait(procs, time.monotonic() + timeout)
        except subprocess.TimeoutExpired:
            _kill(procs)
            raise subprocess.TimeoutExpired(list(cmd), timeout) from None
        finally:
            for f in files:
                f.close()
        return subprocess.CompletedProcess(
            list(cmd), code,
            "".join((tmp / f"rank-{r}.out").read_text(errors="replace") for r in range(ranks)),
            "".join((tmp / f"rank-{r}.err").read_text(errors="replace") for r in range(ranks)))


def _wait(procs: list[subprocess.Popen], deadline: float) -> int:
    """Every rank's exit; the first failure's code, the rest killed after a grace."""
    failed: int | None = None
    kill_at = float("inf")
    while True:
        codes = [p.poll() for p in procs]
        if failed is None:
            failed = next((c for c in codes if c not in (None, 0)), None)
            if failed is not None:
                kill_at = time.monotonic() + FAILURE_GRACE
        if all(c is not None for c in codes):
            return failed or 0
        now = time.monotonic()
        if now >= deadline:
            raise subprocess.TimeoutExpired("ranks", 0)
        if now >= kill_at:
            _kill(procs)
        time.sleep(0.05)


def _kill(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)  # the rank and anything it started
            except ProcessLookupError:
                pass
            p.wait()
