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
    """The tightest cgroup v2 ``cpu.max`` (quota / period, in CPUs) from this process's
    cgroup up to the root; None when there is no quota (``max``) or no cgroup v2."""
    try:
        lines = Path(self_cgroup).read_text().splitlines()
    except OSError:
        return None
    unified = next((line[3:] for line in lines if line.startswith("0::")), None)
    if unified is None:
        return None
    tightest = None
    root = Path(cgroup_root)
    where = root / unified.strip("/")
    while True:
        try:
            quota, period = (where / "cpu.max").read_text().split()[:2]
            if quota != "max":
                cpus = int(quota) / int(period)
                tightest = cpus if tightest is None else min(tightest, cpus)
        except (OSError, ValueError):
            pass
        if where == root or root not in where.parents:
            return tightest
        where = where.parent
