"""The nodes' answers: every command prints one JSON object, ``to_dict()`` of its answer
record below, and the controller reads it back with :func:`parse_answer` (the one decoder of
:mod:`mlxops.node.protocol.decode`); a field either side renames fails both."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from mlxops.node.protocol import bench, calibration, content, parts, send
from mlxops.node.protocol.commands import (
    KEEP_CHECKPOINTS,
    LOGS,
    PREFLIGHT,
    REACH,
    READY,
    SAMPLE,
    SPAWN,
    STATUS,
    STOP,
)
from mlxops.node.protocol.decode import ProtocolError, Record, decode

#: The trainer rewrites its heartbeat after a step at most this often (seconds), and
#: always after its first step and at the end. A file rewrite costs about 1 ms, which is 10%
#: of a 10 ms step on a fast Mac; the watchdog's stall timeouts are whole seconds.
HEARTBEAT_EVERY = 0.5


@dataclass
class Progress(Record):
    """``progress/rank-<r>.json``: the trainer's heartbeat, rewritten after a step at most
    every :data:`HEARTBEAT_EVERY` seconds (and after the first step, and at the end)."""

    rank: int | None = None
    step: int | None = None
    loss: float | None = None
    time: float | None = None            # when it was written (the node's clock)
    pid: int | None = None
    world_size: int | None = None
    tokens_per_sec: float | None = None
    state: str | None = None             # one of PROGRESS_STATES
    # Validation (train.eval_every): the last evaluation's loss, and the best one so far.
    val_loss: float | None = None
    best_val_loss: float | None = None
    best_step: int | None = None         # the step of best_val_loss (its checkpoint: best/)


@dataclass
class Leftover(Record):
    rank: int | str                      # a rank, or LAUNCHER
    pid: int


@dataclass
class PreflightAnswer(Record):
    python: str                          # sys.executable
    python_version: str
    mlx: str | None                      # mlx.core.__version__, None: not importable
    system: str                          # the node's `uname -s` (node/host.py)
    ports_busy: list[int]                # of the ports asked about
    leftovers: list[Leftover]            # processes of this job still alive
    checkpoints: list[int]               # steps of its complete checkpoints, oldest first
    mpirun: str | None = None            # asked with --mpi: mpirun's absolute path
    mpi_libname: str | None = None       # ... and the libmpi MLX should dlopen
    openblas: str | None = None          # Linux: an OpenBLAS ranks preload; None: none, macOS
    cpus: int | None = None              # CPUs this node's processes may use (affinity, quota)
    mlx_lm: str | None = None            # the mlx-lm installed (package metadata); None: none



@dataclass
class SpawnAnswer(Record):
    pids: dict[int, int]                 # rank -> pid of its process group
    launcher: int | None = None          # launcher.sh's pid, when asked to start it
    kernel_cache: str | None = None      # what the run's tmp/mlx links to; None: not safe
    kernel_cache_refused: str | None = None  # ... why not (ranks compile into tmp/mlx)



@dataclass
class RankAnswer(Record):
    """One rank's files and process, as its node sees them now."""

    rank: int
    pid: int | None                      # rank-<r>.pid, None before the rank started
    alive: bool
    exit: int | None                     # rank-<r>.exit
    ended_ago: float | None              # seconds since rank-<r>.exit was written
    started: float | None                # when rank-<r>.pid was written (node clock)
    heartbeat_age: float | None          # seconds since its last progress (or its start)
    progress: Progress | None            # this attempt's heartbeat, None before the first
    log_bytes: int
    failure: str | None = None           # ended non-zero: the line of its log saying why
    requests: int | None = None          # asked (serve jobs, rank 0): requests answered
    busy: bool | None = None             # alive: a process of its group running (state R)



@dataclass
class LauncherAnswer(Record):
    """``launcher.sh`` (mpirun of an mpi job), like a rank: its start is its heartbeat."""

    pid: int | None
    alive: bool
    exit: int | None
    started: float | None
    age: float | None                    # seconds since it started
    ended_ago: float | None


@dataclass
class StatusAnswer(Record):
    now: float                           # the node's clock
    exists: bool                         # the run directory
    stopped: bool                        # the STOPPED_MARKER
    ranks: list[RankAnswer]              # one per rank-<r>.sh here
    checkpoints: list[int]
    launcher: LauncherAnswer | None = None   # where launcher.sh is

    def rank(self, rank: int) -> RankAnswer | None:
        return next((r for r in self.ranks if r.rank == rank), None)

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        if self.launcher is None:
            del doc["launcher"]
        return doc



@dataclass
class StopAnswer(Record):
    """Keys are ranks, LAUNCHER, or ``orted-<pid>`` (an MPI daemon that outlived its ranks)."""

    signalled: list[int | str]           # alive when the stop began: sent SIGTERM
    killed: list[int | str]              # ... and SIGKILL after the grace period
    alive: list[int | str]               # still alive at the end: the stop failed
    ports_busy: list[int]                # of the ports asked about


@dataclass
class LogChunk(Record):
    text: str
    offset: int                          # where the next read starts


@dataclass
class LogsAnswer(Record):
    logs: dict[int | str, LogChunk]      # by rank, and LAUNCHER for mpirun's own log



@dataclass
class KeepCheckpointsAnswer(Record):
    removed: list[int]                   # steps removed


@dataclass
class RunningRank(Record):
    """A process of some job that is alive on the node (``ready``)."""

    job: str                             # the run directory's name under runs/
    rank: int | str                      # a rank, or LAUNCHER
    pid: int


@dataclass
class ReadyAnswer(Record):
    now: float                           # the node's clock (time.time())
    disk_free: int | None                # bytes free on the filesystem of the root
    ports_busy: list[int]                # of the ports asked about
    running: list[RunningRank]           # ranks of any job alive here
    mpirun: str | None = None            # asked with --mpi: mpirun's absolute path
    mpi_libname: str | None = None       # ... and the libmpi MLX should dlopen
    working_set: int | None = None       # MLX's recommended GPU working set, bytes; None: CPU



@dataclass
class ReachAnswer(Record):
    listened: list[int]                  # this node's ports it could listen on
    reached: dict[str, list[int]]        # peer -> the peer's ports this node connected to
    unreached: dict[str, str]            # peer -> why a port of it was not reached


@dataclass
class GpuSample(Record):
    """macOS: the GPU's ``PerformanceStatistics`` as ``ioreg`` shows them without sudo."""

    utilization: float | None = None     # "Device Utilization %"
    renderer: float | None = None        # "Renderer Utilization %"
    memory_in_use: int | None = None     # "In use system memory", bytes


@dataclass
class MetricsChunk(Record):
    """New complete lines of rank 0's ``metrics.jsonl``."""

    text: str
    offset: int                          # where the next read starts
    inode: int                           # the file's, to notice it was rewritten
    reset: bool = False                  # read from 0: the file was rewritten or replaced


@dataclass
class SampleAnswer(Record):
    now: float                           # the node's clock
    system: str                          # the node's `uname -s` (node/host.py)
    cpus: int | None = None
    load: list[float] | None = None      # 1, 5 and 15 minute load averages
    memory_total: int | None = None      # bytes
    memory_used: int | None = None       # bytes in use (macOS: app + wired + compressed)
    gpu: GpuSample | None = None
    metrics: MetricsChunk | None = None  # asked with --metrics-from, and the file exists
    status: StatusAnswer | None = None   # asked with --status



Answer = (PreflightAnswer | SpawnAnswer | StatusAnswer | StopAnswer | LogsAnswer
          | KeepCheckpointsAnswer | ReadyAnswer | ReachAnswer | SampleAnswer)
ANSWERS: dict[str, type[Record]] = {
    PREFLIGHT: PreflightAnswer, SPAWN: SpawnAnswer, STATUS: StatusAnswer, STOP: StopAnswer,
    LOGS: LogsAnswer, KEEP_CHECKPOINTS: KeepCheckpointsAnswer,
    READY: ReadyAnswer, REACH: ReachAnswer,
    SAMPLE: SampleAnswer,
}


def answer_line(answer: Record) -> str:
    """What the node prints: the answer as one line of JSON."""
    return json.dumps(answer.to_dict())


def parse_answer(command: str, line: str) -> Any:
    """The controller's reading of ``command``'s answer line; ProtocolError if unreadable."""
    try:
        doc = json.loads(line)
    except ValueError as exc:
        raise ProtocolError(f"{command}: not JSON: {line[-200:]!r}") from exc
    kind = (ANSWERS.get(command) or bench.ANSWERS.get(command)
            or calibration.ANSWERS.get(command) or content.ANSWERS.get(command)
            or parts.ANSWERS.get(command) or send.ANSWERS.get(command))
    if kind is None:
        raise ProtocolError(f"{command}: not a node command")
    try:
        return decode(kind, doc)
    except ProtocolError as exc:
        raise ProtocolError(f"{command}: {exc}") from None
