"""A Linux node's OpenBLAS, and the CPUs it can give its ranks (part of the ``preflight``
answer, docs/node-protocol.md).

MLX's Linux CPU wheel carries netlib's reference BLAS; with an OpenBLAS preloaded in its
place (``LD_PRELOAD``) a float32 matmul runs tens of times faster. Pre-flight reports the
first OpenBLAS found here that this node's interpreter could load, and the controller
preloads it into every rank (docs/job-file.md, "What each rank gets"). macOS has
Accelerate (and Metal): nothing is looked for there.

Standard library only: synced to nodes with the other helpers. The provision task
``blas`` (mlxops/tasks/blas.py) looks in the same places, from :data:`OPENBLAS_GLOBS`.
"""

from __future__ import annotations

import glob
import math
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

#: Where distributions put OpenBLAS, in order of preference. The pthread build first: its
#: thread count follows ``OPENBLAS_NUM_THREADS``. (The OpenMP build reads
#: ``OMP_NUM_THREADS`` instead, so ``openblas-openmp/`` is not looked in; a Debian
#: ``libopenblas.so.0`` alternative pointing there is still taken.)
OPENBLAS_GLOBS = (
    "/usr/lib/*/openblas-pthread/libopenblas.so.0",   # Debian, Ubuntu: libopenblas0-pthread
    "/usr/lib/*/libopenblas.so.0",                    # ... the alternatives' link
    "/usr/lib64/libopenblasp.so.0",                   # Fedora, RHEL: openblas-threads
    "/usr/lib64/libopenblas.so.0",
    "/usr/lib/libopenblas.so.0",                      # Arch
    "/usr/local/lib/libopenblas.so.0",                # built from source
    "/opt/OpenBLAS/lib/libopenblas.so.0",             # ... with OpenBLAS's default prefix
)
LIBRARY = "libopenblas"

#: How long an idle OpenBLAS thread spins before it sleeps, as a power of two of CPU
#: cycles (``OPENBLAS_THREAD_TIMEOUT``; OpenBLAS takes 4 to 30). Its own default is 28:
#: after each call every helper thread spins 2**28 cycles, ~0.1 s at 2.5 GHz. A rank of a
#: distributed job waits for its peers between its matmuls (the all-reduce, the next
#: batch), so its helpers would spin through every wait, on the cores its communication
#: thread and the other ranks of the node need. 2**18 cycles (~0.1 ms) keeps them awake
#: across the calls of one step. Measured on a 2-core Linux machine, 2 threads: 100
#: matmuls of 256x256 with a 20 ms wait after each took 2.11 CPU-s at the default and
#: 0.10 at 18, 50 back-to-back 512x512 ones took the same time at either.
THREAD_TIMEOUT = 18


def find_openblas(globs: tuple[str, ...] = OPENBLAS_GLOBS, *, ldconfig: bool = True,
                  interpreter: str = sys.executable) -> str | None:
    """The first OpenBLAS in ``globs`` (then in ``ldconfig -p``) that ``interpreter`` could
    load: an ELF file of its class, byte order and machine. None when there is none."""
    want = elf_kind(interpreter)
    if want is None:
        return None
    for path in (path for pattern in globs for path in sorted(glob.glob(pattern))):
        if elf_kind(path) == want:
            return path
    # The linker's cache only when the usual places have none (it costs a process).
    return next((p for p in ldconfig_paths() if elf_kind(p) == want), None) if ldconfig \
        else None


def ldconfig_paths() -> list[str]:
    """The ``libopenblas*.so*`` paths the dynamic linker's cache lists."""
    for tool in ("ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig"):
        try:
            out = subprocess.run([tool, "-p"], capture_output=True, text=True, timeout=10,
                                 check=False).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        # "	libopenblas.so.0 (libc6,x86-64) => /lib/x86_64-linux-gnu/libopenblas.so.0"
        return [line.split("=>", 1)[1].strip() for line in out.splitlines()
                if line.strip().startswith(LIBRARY) and "=>" in line]
    return []


def elf_kind(path: str) -> tuple[int, int, int] | None:
    """``(class, byte order, machine)`` of an ELF file; None for anything else."""
    try:
        with open(path, "rb") as f:
            head = f.read(20)
    except OSError:
        return None
    if len(head) < 20 or head[:4] != b"\x7fELF":
        return None
    order = "little" if head[5] == 1 else "big"
    return head[4], head[5], int.from_bytes(head[18:20], order)


def thread_env(cpus: int | None, ranks_here: int) -> dict[str, str]:
    """The OpenBLAS thread settings of one of ``ranks_here`` ranks on a node whose processes
    may use ``cpus`` CPUs (None: unknown): its share of them, at least 1, as
    ``OPENBLAS_NUM_THREADS``, and a short spin when idle (:data:`THREAD_TIMEOUT`)."""
    env = {"OPENBLAS_THREAD_TIMEOUT": str(THREAD_TIMEOUT)}
    if cpus:
        env["OPENBLAS_NUM_THREADS"] = str(max(1, cpus // max(1, ranks_here)))
    return env


def usable_cpus(cgroup_root: str = "/sys/fs/cgroup", self_cgroup: str = "/proc/self/cgroup"
                ) -> int:
    """The CPUs this node's processes may run on: the affinity mask (``taskset``, cpusets),
    lowered to a cgroup v2 CPU quota (``cpu.max``, containers) when one is set on this
    process's cgroup or an ancestor, rounded up. At least 1."""
    try:
        count = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        count = os.cpu_count() or 1
    quota = cgroup_quota(cgroup_root, self_cgroup)
    if quota is not None:
        count = min(count, max(1, math.ceil(quota)))
    return max(1, count)


def cgroup_quota(cgroup_root: str, self_cgroup: str) -> float | None:
    """The tightest CPU quota (quota / period, in CPUs) from this process's cgroup up to
    the root: cgroup v2 ``cpu.max``, or v1's ``cpu.cfs_quota_us`` on hosts whose cpu
    controller is still in the v1 hierarchy. None when there is no quota or no cgroup."""
    try:
        lines = Path(self_cgroup).read_text().splitlines()
    except OSError:
        return None
    root = Path(cgroup_root)
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":
            found = _tightest(root, root / path.strip("/"), _v2_quota)
        elif "cpu" in controllers.split(","):
            mount = root / controllers  # "cpu", or "cpu,cpuacct" where they are joined
            found = _tightest(mount, mount / path.strip("/"), _v1_quota)
        else:
            continue
        if found is not None:
            return found
    return None


def _tightest(root: Path, where: Path, read: Callable[[Path], float | None]) -> float | None:
    """The smallest quota ``read`` finds from ``where`` up to ``root``."""
    tightest = None
    while True:
        try:
            cpus = read(where)
        except (OSError, ValueError):
            cpus = None
        if cpus is not None:
            tightest = cpus if tightest is None else min(tightest, cpus)
        if where == root or root not in where.parents:
            return tightest
        where = where.parent


def _v2_quota(where: Path) -> float | None:
    quota, period = (where / "cpu.max").read_text().split()[:2]
    return None if quota == "max" else int(quota) / int(period)


def _v1_quota(where: Path) -> float | None:
    quota = int((where / "cpu.cfs_quota_us").read_text())
    period = int((where / "cpu.cfs_period_us").read_text())
    return None if quota < 0 else quota / period
