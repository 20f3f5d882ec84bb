"""What a node says for the controller's metrics mirror: the ``sample`` command
(docs/node-protocol.md). Its memory in use and total, load and, on macOS, GPU figures
(``vm_stat``, ``sysctl``, ``ioreg``: none needs sudo); with a run directory, the job's
``status`` answer and the new lines of rank 0's ``metrics.jsonl``. Reads only. Which
source is read depends on what the node has (:mod:`mlxops.node.host`).
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

from mlxops.node import host, protocol
from mlxops.node.status import status as job_status

TOOL_TIMEOUT = 3.0  # seconds for vm_stat / sysctl / ioreg: a sample must not hang a feed


def _run(argv: list[str]) -> str | None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=TOOL_TIMEOUT)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def linux_memory(meminfo: str) -> tuple[int | None, int | None]:
    """``(total, used)`` bytes from ``/proc/meminfo``: used is total minus MemAvailable
    (what the kernel could give a new process without swapping)."""
    values = {}
    for line in meminfo.splitlines():
        key, _, rest = line.partition(":")
        words = rest.split()
        if words and words[0].isdigit():
            values[key.strip()] = int(words[0]) * 1024  # kB
    total = values.get("MemTotal")
    available = values.get("MemAvailable")
    if total is None:
        return None, None
    return total, None if available is None else max(0, total - available)


def vm_stat_used(text: str) -> int | None:
    """Bytes in use from ``vm_stat``, as Activity Monitor counts "Memory Used": app memory
    (anonymous pages less purgeable ones) + wired + compressed. Older macOS without the
    "Anonymous pages" line: active + wired + compressed."""
    size = re.search(r"page size of (\d+) bytes", text)
    pages = {m.group(1).strip().strip('"'): int(m.group(2))
             for m in re.finditer(r"^([^:\n]+):\s+(\d+)\.?\s*$", text, re.M)}
    if not size:
        return None
    wired = pages.get("Pages wired down")
    compressed = pages.get("Pages occupied by compressor", 0)
    if wired is None:
        return None
    if "Anonymous pages" in pages:
        app = pages["Anonymous pages"] - pages.get("Pages purgeable", 0)
    elif "Pages active" in pages:
        app = pages["Pages active"]
    else:
        return None
    return (max(0, app) + wired + compressed) * int(size.group(1))


def ioreg_gpu(text: str) -> protocol.GpuSample | None:
    """The first accelerator's ``PerformanceStatistics`` in ``ioreg -r -d 1 -w 0 -c
    IOAccelerator`` output, or None when it has none."""
    block = re.search(r'"PerformanceStatistics" = \{([^}]*)\}', text)
    if not block:
        return None
    stats = {k: int(v) for k, v in re.findall(r'"([^"]+)"=(-?\d+)', block.group(1))}
    gpu = protocol.GpuSample(utilization=_float(stats.get("Device Utilization %")),
                             renderer=_float(stats.get("Renderer Utilization %")),
                             memory_in_use=stats.get("In use system memory"))
    if gpu.utilization is None and gpu.renderer is None and gpu.memory_in_use is None:
        return None
    return gpu


def _float(value: int | None) -> float | None:
    return None if value is None else float(value)


MEMINFO = Path("/proc/meminfo")


def memory() -> tuple[int | None, int | None]:
    """``(total, used)`` bytes on this node: ``/proc/meminfo`` where there is one (Linux),
    else ``sysctl hw.memsize`` and ``vm_stat`` (macOS); None where it cannot be read."""
    try:
        return linux_memory(MEMINFO.read_text())
    except OSError:
        pass
    total = _run(["sysctl", "-n", "hw.memsize"])
    vm = _run(["vm_stat"])
    return (int(total) if total and total.strip().isdigit() else None,
            vm_stat_used(vm) if vm else None)


def gpu() -> protocol.GpuSample | None:
    """The GPU's figures where the node has ``ioreg`` (macOS); MLX on Linux runs on the
    CPU, with no GPU figures to show."""
    if not host.has_tool("ioreg"):
        return None
    out = _run(["ioreg", "-r", "-d", "1", "-w", "0", "-c", "IOAccelerator"])
    return ioreg_gpu(out) if out else None


def metrics_chunk(path: Path, start: int, inode: int | None, max_bytes: int
                  ) -> protocol.MetricsChunk | None:
    """Complete lines of ``path`` from byte ``start``; from 0 (``reset``) when the file is
    another one than ``inode`` (the trainer rewrites it atomically when it resumes and
    drops the steps it will redo) or shorter than ``start``."""
    try:
        handle = open(path, "rb")
    except OSError:
        return None
    with handle:
        stat = os.fstat(handle.fileno())
        reset = (inode is not None and stat.st_ino != inode) or start > stat.st_size
        if reset:
            start = 0
        handle.seek(start)
        data = handle.read(max_bytes)
    end = data.rfind(b"\n") + 1   # a line being written waits for the next ask
    return protocol.MetricsChunk(text=data[:end].decode(errors="replace"), offset=start + end,
                                 inode=stat.st_ino, reset=reset)


def sample(run_dir: Path | None, *, with_status: bool = False, metrics_from: int | None = None,
           metrics_inode: int | None = None,
           max_bytes: int = protocol.SAMPLE_MAX_BYTES) -> protocol.SampleAnswer:
    total, used = memory()
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    answer = protocol.SampleAnswer(now=time.time(), system=host.system(),
                                   cpus=os.cpu_count(), load=load, memory_total=total,
                                   memory_used=used, gpu=gpu())
    if run_dir is not None:
        if with_status:
            answer.status = job_status(run_dir)
        if metrics_from is not None:
            answer.metrics = metrics_chunk(run_dir / protocol.METRICS, metrics_from,
                                           metrics_inode, max_bytes)
    return answer
