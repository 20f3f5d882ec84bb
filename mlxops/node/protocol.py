"""The controller-node protocol: the one definition of what crosses the SSH boundary.

Standard library only. The controller (``mlxops.jobs``), the node helpers
(``python -m mlxops.node``) and the trainer all import this module, and the node side imports
nothing else of mlxops: it is synced to every node with the trainer. A name, a file or a
state spelt here is spelt nowhere else. The contract is written out for people in
``docs/node-protocol.md``.

Vocabulary:

* backends MLX can run a job on, and which of them mlxops renders for;
* the states of a rank and of a job (``mlxops status``), and the trainer's progress states;
* the run directory of a job on a node (``<mlxops_root>/runs/<name>/``) and the rule for a
  complete checkpoint inside it;
* the node's commands: the argument list of each (built by the controller, parsed by the
  node with :func:`parser`) and its answer, a typed record the node prints as one line of
  JSON and the controller reads back with :func:`parse_answer`.

Longer than the project's other modules on purpose: both ends of the contract in one file,
so that neither side can change a name without the other.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path, PurePath
from typing import Any

# --- backends ------------------------------------------------------------------------------

RING, MPI, JACCL, JACCL_RING = "ring", "mpi", "jaccl", "jaccl-ring"
#: Every backend a job, a hostfile or a host's ``mlxops_backend`` may name. (MLX's ``nccl``
#: is CUDA only: no Mac runs it, so mlxops never offers it.)
BACKENDS = (RING, MPI, JACCL, JACCL_RING)
#: RDMA over Thunderbolt 5: macOS only, ``MLX_IBV_DEVICES`` + a coordinator.
JACCL_BACKENDS = (JACCL, JACCL_RING)
DEFAULT_BACKEND = RING

# --- states --------------------------------------------------------------------------------

RUNNING, FINISHED, FAILED, STALLED, STOPPED = "running", "finished", "failed", "stalled", "stopped"
UNREACHABLE = "unreachable"
#: A rank's state in ``mlxops status`` (unreachable: its host did not answer).
RANK_STATES = (RUNNING, FINISHED, FAILED, STALLED, STOPPED, UNREACHABLE)
#: A job's state: the record's, and the one ``mlxops status`` derives from its ranks.
JOB_STATES = (RUNNING, FINISHED, FAILED, STALLED, STOPPED)
#: States after which nothing of the job runs any more.
ENDED_STATES = (FINISHED, FAILED, STOPPED)
#: What the trainer writes in ``progress/rank-<r>.json``.
PROGRESS_STATES = (RUNNING, FINISHED)

# --- the run directory ---------------------------------------------------------------------

#: The mpi launcher (mpirun, on a job's first host): its files are ``launcher.*`` and it is
#: keyed ``"launcher"`` wherever ranks are keyed by number (logs, status, stop answers).
LAUNCHER = "launcher"

STOPPED_MARKER = "stopped"      # present while the job was stopped on purpose by mlxops
PROGRESS_DIR = "progress"
METRICS = "metrics.jsonl"       # rank 0's node: one JSON object per logged step
#: Every node (its writer rank): the speeds ``train.balance: auto`` measured and the split
#: they gave (docs/trainer.md); ``mlxops plan`` reads the job's last one.
CALIBRATION = "calibration.json"
TRAINER_CONFIG = "trainer.json"
RING_HOSTFILE = "hostfile.json"
IBV_DEVICES = "ibv_devices.json"
CKPT_DIR = "ckpt"
LATEST = "latest"               # ckpt/latest: the name of the newest checkpoint directory
CKPT_PREFIX = "step-"
CKPT_STATE = "state.json"
CKPT_MODEL, CKPT_OPTIMIZER = "model.safetensors", "optimizer.safetensors"
#: What a complete checkpoint directory holds.
CKPT_FILES = (CKPT_MODEL, CKPT_OPTIMIZER, CKPT_STATE)

#: The files of one process the run directory keeps: its start script, pid (the process
#: group it leads), combined stdout+stderr, and exit code (written when it ends by itself).
SCRIPT, PID, LOG, EXIT = "sh", "pid", "log", "exit"


def stem(rank: int | str) -> str:
    """``rank-3`` for rank 3, ``launcher`` for the launcher."""
    return LAUNCHER if rank == LAUNCHER else f"rank-{int(rank)}"


def process_file(rank: int | str, kind: str) -> str:
    """``rank-3.pid``, ``launcher.log``, ...: a file of one rank (or the launcher)."""
    return f"{stem(rank)}.{kind}"


def progress_file(rank: int) -> str:
    """The trainer's heartbeat of one rank, relative to the run directory."""
    return f"{PROGRESS_DIR}/rank-{int(rank)}.json"


def rank_of_script(name: str) -> int | None:
    """3 for ``rank-3.sh``; None for any other name."""
    if not (name.startswith("rank-") and name.endswith(f".{SCRIPT}")):
        return None
    number = name[len("rank-"):-len(SCRIPT) - 1]
    return int(number) if number.isdigit() else None


def checkpoint_name(step: int) -> str:
    """``step-00000050``: zero-padded, so names sort like steps."""
    return f"{CKPT_PREFIX}{step:08d}"


def checkpoint_step(name: str) -> int | None:
    """50 for ``step-00000050``; None for any other name (``.tmp-*``, ``latest``)."""
    if not name.startswith(CKPT_PREFIX):
        return None
    number = name[len(CKPT_PREFIX):]
    return int(number) if number.isdigit() else None


def checkpoint_complete(path: PurePath) -> bool:
    """The one rule for a usable checkpoint: every file present, ``state.json`` readable.

    A checkpoint is written under a temporary name and renamed into place, so a directory
    named ``step-*`` is normally whole; this also refuses one damaged afterwards.
    """
    directory = Path(path)
    if checkpoint_step(directory.name) is None:
        return False
    if not all((directory / f).is_file() for f in CKPT_FILES):
        return False
    try:
        json.loads((directory / CKPT_STATE).read_text())
    except (OSError, ValueError):
        return False
    return True


def complete_checkpoints(ckpt_dir: PurePath) -> list[Path]:
    """The complete checkpoints in a ``ckpt/`` directory, oldest first."""
    directory = Path(ckpt_dir)
    if not directory.is_dir():
        return []
    found = [d for d in directory.iterdir() if checkpoint_complete(d)]
    return sorted(found, key=lambda d: checkpoint_step(d.name) or 0)


#: Under a node's ``mlxops_root``: the synced code (``PYTHONPATH``) and the jobs' run
#: directories.
CODE_DIR, RUNS_DIR = "code", "runs"


def run_path(name: str) -> str:
    """``runs/<name>``: a job's run directory, relative to ``mlxops_root``."""
    return f"{RUNS_DIR}/{name}"


def rank_glob(kind: str) -> str:
    """``rank-*.pid``: a glob of one kind of file of every rank."""
    return f"rank-*.{kind}"


def attempt_files() -> list[str]:
    """Globs, relative to the run directory, of what one attempt leaves that the next must
    not read as its own: scripts, pids, exit codes and heartbeats (never logs, metrics or
    checkpoints). Cleared before an attempt's files are written."""
    kinds = (SCRIPT, PID, EXIT)
    return [*(rank_glob(k) for k in kinds), *(process_file(LAUNCHER, k) for k in kinds),
            f"{PROGRESS_DIR}/{rank_glob('json')}"]


# --- commands ------------------------------------------------------------------------------
# ``python -m mlxops.node COMMAND --run-dir DIR ...``: the controller builds each argument
# list with the function below it, the node parses it with parser(); nothing else spells a flag.

PREFLIGHT, SPAWN, STATUS = "preflight", "spawn", "status"
STOP, LOGS, KEEP_CHECKPOINTS = "stop", "logs", "keep-checkpoints"
COMMANDS = (PREFLIGHT, SPAWN, STATUS, STOP, LOGS, KEEP_CHECKPOINTS)


def preflight_args(run_dir: str, *, ip: str = "", ports: Sequence[int] = (),
                   mpi: bool = False) -> list[str]:
    """Pre-flight: this job's leftovers and checkpoints, ``ports`` busy on ``ip`` (ring),
    mpirun and libmpi (``mpi``), Python and mlx, an OpenBLAS (Linux) and the CPU count."""
    return [PREFLIGHT, "--run-dir", run_dir, "--ip", ip, *(["--mpi"] if mpi else []),
            "--ports", *map(str, ports)]


def spawn_args(run_dir: str, ranks: Sequence[int], *, launcher: bool = False) -> list[str]:
    """Start ``ranks`` (and with ``launcher``, ``launcher.sh``) detached."""
    return [SPAWN, "--run-dir", run_dir, "--ranks", *map(str, ranks),
            *(["--launcher"] if launcher else [])]


def status_args(run_dir: str) -> list[str]:
    return [STATUS, "--run-dir", run_dir]


def stop_args(run_dir: str, grace: float, *, ip: str = "", ports: Sequence[int] = ()
              ) -> list[str]:
    """Stop everything of the job here; with ``ports``, also say which are still busy."""
    check = ["--ip", ip, "--ports", *map(str, ports)] if ports else []
    return [STOP, "--run-dir", run_dir, "--grace", str(grace), *check]


def logs_args(run_dir: str, *, rank: int | None = None,
              offsets: Mapping[int | str, int] | None = None, tail: int = 0) -> list[str]:
    """New log bytes since ``offsets`` (keyed by rank or LAUNCHER); ``rank``: that one only;
    ``tail``: without offsets, start this many bytes before the end."""
    args = [LOGS, "--run-dir", run_dir, "--tail", str(tail)]
    if rank is not None:
        args += ["--rank", str(rank)]
    if offsets:
        args += ["--offsets", *(f"{key}:{at}" for key, at in offsets.items())]
    return args


def keep_checkpoints_args(run_dir: str, step: int) -> list[str]:
    """Remove the complete checkpoints newer than ``step``."""
    return [KEEP_CHECKPOINTS, "--run-dir", run_dir, "--step", str(step)]


# Readiness (``mlxops check``): not of one job, so no ``--run-dir``. ``ready`` reads every
# job's run directory under the root; ``reach`` listens on this node's ring ports for a few
# seconds while connecting to its peers'. Neither changes a file on the node.
READY, REACH = "ready", "reach"
CHECK_COMMANDS = (READY, REACH)


def ready_args(root: str, *, ip: str = "", ports: Sequence[int] = (), mpi: bool = False
               ) -> list[str]:
    """The node's clock, free disk under ``root``, ranks of any job alive there, ``ports``
    busy on ``ip`` and (``mpi``) mpirun."""
    return [READY, "--root", root, "--ip", ip, *(["--mpi"] if mpi else []),
            "--ports", *map(str, ports)]


def reach_args(name: str, *, ip: str, ports: Sequence[int],
               peers: Mapping[str, tuple[str, Sequence[int]]], seconds: float) -> list[str]:
    """Listen on ``ip``:``ports`` while connecting to each peer's address and ports
    (``{peer: (ip, ports)}``), for at most ``seconds``; ``name``: how peers know this node."""
    words = [f"{peer}={address}:{','.join(map(str, peer_ports))}"
             for peer, (address, peer_ports) in peers.items()]
    return [REACH, "--name", name, "--ip", ip, "--seconds", str(seconds),
            "--ports", *map(str, ports), "--peers", *words]


# Monitoring (``mlxops monitor``, ``dashboard``, ``report``): one ``sample`` per host feeds
# the controller's metrics mirror (docs/formats.md, "The metrics mirror"). Reads only.
SAMPLE = "sample"
MONITOR_COMMANDS = (SAMPLE,)
#: A metrics chunk ends at a line end: a line the trainer is writing waits for the next ask.
SAMPLE_MAX_BYTES = 1 << 20


def sample_args(run_dir: str = "", *, metrics_from: int | None = None,
                metrics_inode: int | None = None, status: bool = False) -> list[str]:
    """The node's memory, load and GPU now; with ``run_dir``: with ``status``, the job's
    ``status`` answer too, and with ``metrics_from``, rank 0's ``metrics.jsonl`` from that
    byte (read from 0 when its inode is not ``metrics_inode`` or it is shorter: rewritten)."""
    args = [SAMPLE]
    if run_dir:
        args += ["--run-dir", run_dir, *(["--status"] if status else [])]
        if metrics_from is not None:
            args += ["--metrics-from", str(metrics_from)]
            if metrics_inode is not None:
                args += ["--metrics-inode", str(metrics_inode)]
    return args


def _add_monitor_parsers(sub: Any) -> None:
    sample = sub.add_parser(SAMPLE)
    sample.add_argument("--run-dir", default="")
    sample.add_argument("--status", action="store_true", help="also the job's status answer")
    sample.add_argument("--metrics-from", type=int, default=None,
                        help="byte offset in metrics.jsonl the controller has read up to")
    sample.add_argument("--metrics-inode", type=int, default=None)
    sample.add_argument("--max-bytes", type=int, default=SAMPLE_MAX_BYTES)


def parse_peers(words: Sequence[str]) -> dict[str, tuple[str, list[int]]]:
    """``["mac2=10.0.0.2:32324,32325"]`` -> ``{"mac2": ("10.0.0.2", [32324, 32325])}``
    (the last ``=`` ends the name, the last ``:`` the address, so IPv6 addresses work)."""
    peers = {}
    for word in words:
        name, _, where = word.rpartition("=")
        address, _, ports = where.rpartition(":")
        peers[name] = (address, [int(p) for p in ports.split(",") if p])
    return peers


def parse_offsets(words: Sequence[str]) -> dict[int | str, int]:
    """``["0:120", "launcher:8"]`` -> ``{0: 120, "launcher": 8}``."""
    pairs = (word.rsplit(":", 1) for word in words)
    return {rank_key(key): int(at) for key, at in pairs}


def rank_key(word: str) -> int | str:
    """A rank as JSON keys and offsets spell it: ``"3"`` -> 3, ``"launcher"`` stays."""
    return LAUNCHER if word == LAUNCHER else int(word)


def parser() -> argparse.ArgumentParser:
    """The node's parser of the argument lists built above."""
    p = argparse.ArgumentParser(prog="python -m mlxops.node")
    sub = p.add_subparsers(dest="cmd", required=True)
    commands = {name: sub.add_parser(name) for name in COMMANDS + CHECK_COMMANDS}
    for name in COMMANDS:
        commands[name].add_argument("--run-dir", required=True)
    for name in (PREFLIGHT, STOP):
        commands[name].add_argument("--ip", default="")
        commands[name].add_argument("--ports", type=int, nargs="*", default=[])
    commands[PREFLIGHT].add_argument("--mpi", action="store_true",
                                     help="also find mpirun and libmpi")
    commands[SPAWN].add_argument("--ranks", type=int, nargs="*", default=[])
    commands[SPAWN].add_argument("--launcher", action="store_true",
                                 help="also start launcher.sh (mpirun of an mpi job)")
    commands[STOP].add_argument("--grace", type=float, default=5.0)
    logs = commands[LOGS]
    logs.add_argument("--rank", type=int)
    logs.add_argument("--offsets", nargs="*", default=[],
                      help="rank:byte_offset ... (launcher:byte_offset for mpirun's log)")
    logs.add_argument("--tail", type=int, default=0, help="start this many bytes from the end")
    logs.add_argument("--max-bytes", type=int, default=1 << 20)
    commands[KEEP_CHECKPOINTS].add_argument("--step", type=int, required=True)
    ready = commands[READY]
    ready.add_argument("--root", required=True)
    ready.add_argument("--ip", default="")
    ready.add_argument("--ports", type=int, nargs="*", default=[])
    ready.add_argument("--mpi", action="store_true", help="also find mpirun and libmpi")
    reach = commands[REACH]
    reach.add_argument("--name", required=True)
    reach.add_argument("--ip", required=True)
    reach.add_argument("--ports", type=int, nargs="*", default=[])
    reach.add_argument("--peers", nargs="*", default=[], help="name=ip:port,port ...")
    reach.add_argument("--seconds", type=float, default=10.0)
    from mlxops.node import benchproto  # the bench's commands (it imports this module)

    benchproto.add_parsers(sub)
    _add_monitor_parsers(sub)
    return p


# --- answers -------------------------------------------------------------------------------
# Every command prints one JSON object: ``to_dict()`` of its answer below. The controller
# reads it back with ``parse_answer``; a field either side renames fails both.


class ProtocolError(ValueError):
    """An answer without the shape this side knows (node helpers of another version)."""


class _Answer:
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]

    @classmethod
    def _fields(cls, doc: Any) -> dict[str, Any]:
        """The record's fields from ``doc``: a field without a default must be there; keys
        it does not know are left out (a newer node may say more)."""
        if not isinstance(doc, Mapping):
            raise ProtocolError(f"{cls.__name__}: want a JSON object, got {doc!r:.100}")
        out = {}
        for f in fields(cls):  # type: ignore[arg-type]
            if f.name in doc:
                out[f.name] = doc[f.name]
            elif f.default is MISSING and f.default_factory is MISSING:
                raise ProtocolError(f"{cls.__name__}: no {f.name!r} in {dict(doc)!r:.200}")
        return out

    @classmethod
    def from_dict(cls, doc: Any) -> Any:
        return cls(**cls._fields(doc))


#: The trainer rewrites its heartbeat after a step at most this often (seconds), and
#: always after its first step and at the end. A file rewrite costs about 1 ms, which is 10%
#: of a 10 ms step on a fast Mac; the watchdog's stall timeouts are whole seconds.
HEARTBEAT_EVERY = 0.5


@dataclass
class Progress(_Answer):
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


@dataclass
class Leftover(_Answer):
    rank: int | str                      # a rank, or LAUNCHER
    pid: int


@dataclass
class PreflightAnswer(_Answer):
    python: str                          # sys.executable
    python_version: str
    mlx: str | None                      # mlx.core.__version__, None: not importable
    system: str                          # platform.system()
    ports_busy: list[int]                # of the ports asked about
    leftovers: list[Leftover]            # processes of this job still alive
    checkpoints: list[int]               # steps of its complete checkpoints, oldest first
    mpirun: str | None = None            # asked with --mpi: mpirun's absolute path
    mpi_libname: str | None = None       # ... and the libmpi MLX should dlopen
    openblas: str | None = None          # Linux: an OpenBLAS ranks preload; None: none, macOS
    cpus: int | None = None              # CPUs this node's processes may use (affinity, quota)

    @classmethod
    def from_dict(cls, doc: Any) -> PreflightAnswer:
        got = cls._fields(doc)
        got["leftovers"] = [Leftover.from_dict(x) for x in got["leftovers"]]
        return cls(**got)


@dataclass
class SpawnAnswer(_Answer):
    pids: dict[int, int]                 # rank -> pid of its process group
    launcher: int | None = None          # launcher.sh's pid, when asked to start it

    @classmethod
    def from_dict(cls, doc: Any) -> SpawnAnswer:
        got = cls._fields(doc)
        got["pids"] = {int(r): pid for r, pid in got["pids"].items()}
        return cls(**got)


@dataclass
class RankAnswer(_Answer):
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

    @classmethod
    def from_dict(cls, doc: Any) -> RankAnswer:
        got = cls._fields(doc)
        got["progress"] = None if got["progress"] is None else Progress.from_dict(
            got["progress"])
        return cls(**got)


@dataclass
class LauncherAnswer(_Answer):
    """``launcher.sh`` (mpirun of an mpi job), like a rank: its start is its heartbeat."""

    pid: int | None
    alive: bool
    exit: int | None
    started: float | None
    age: float | None                    # seconds since it started
    ended_ago: float | None


@dataclass
class StatusAnswer(_Answer):
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

    @classmethod
    def from_dict(cls, doc: Any) -> StatusAnswer:
        got = cls._fields(doc)
        got["ranks"] = [RankAnswer.from_dict(r) for r in got["ranks"]]
        if got.get("launcher") is not None:
            got["launcher"] = LauncherAnswer.from_dict(got["launcher"])
        return cls(**got)


@dataclass
class StopAnswer(_Answer):
    """Keys are ranks, LAUNCHER, or ``orted-<pid>`` (an MPI daemon that outlived its ranks)."""

    signalled: list[int | str]           # alive when the stop began: sent SIGTERM
    killed: list[int | str]              # ... and SIGKILL after the grace period
    alive: list[int | str]               # still alive at the end: the stop failed
    ports_busy: list[int]                # of the ports asked about


@dataclass
class LogChunk(_Answer):
    text: str
    offset: int                          # where the next read starts


@dataclass
class LogsAnswer(_Answer):
    logs: dict[int | str, LogChunk]      # by rank, and LAUNCHER for mpirun's own log

    @classmethod
    def from_dict(cls, doc: Any) -> LogsAnswer:
        got = cls._fields(doc)
        return cls({rank_key(k): LogChunk.from_dict(v) for k, v in got["logs"].items()})


@dataclass
class KeepCheckpointsAnswer(_Answer):
    removed: list[int]                   # steps removed


@dataclass
class RunningRank(_Answer):
    """A process of some job that is alive on the node (``ready``)."""

    job: str                             # the run directory's name under runs/
    rank: int | str                      # a rank, or LAUNCHER
    pid: int


@dataclass
class ReadyAnswer(_Answer):
    now: float                           # the node's clock (time.time())
    disk_free: int | None                # bytes free on the filesystem of the root
    ports_busy: list[int]                # of the ports asked about
    running: list[RunningRank]           # ranks of any job alive here
    mpirun: str | None = None            # asked with --mpi: mpirun's absolute path
    mpi_libname: str | None = None       # ... and the libmpi MLX should dlopen
    working_set: int | None = None       # MLX's recommended GPU working set, bytes; None: CPU

    @classmethod
    def from_dict(cls, doc: Any) -> ReadyAnswer:
        got = cls._fields(doc)
        got["running"] = [RunningRank.from_dict(x) for x in got["running"]]
        return cls(**got)


@dataclass
class ReachAnswer(_Answer):
    listened: list[int]                  # this node's ports it could listen on
    reached: dict[str, list[int]]        # peer -> the peer's ports this node connected to
    unreached: dict[str, str]            # peer -> why a port of it was not reached


@dataclass
class GpuSample(_Answer):
    """macOS: the GPU's ``PerformanceStatistics`` as ``ioreg`` shows them without sudo."""

    utilization: float | None = None     # "Device Utilization %"
    renderer: float | None = None        # "Renderer Utilization %"
    memory_in_use: int | None = None     # "In use system memory", bytes


@dataclass
class MetricsChunk(_Answer):
    """New complete lines of rank 0's ``metrics.jsonl``."""

    text: str
    offset: int                          # where the next read starts
    inode: int                           # the file's, to notice it was rewritten
    reset: bool = False                  # read from 0: the file was rewritten or replaced


@dataclass
class SampleAnswer(_Answer):
    now: float                           # the node's clock
    system: str                          # platform.system()
    cpus: int | None = None
    load: list[float] | None = None      # 1, 5 and 15 minute load averages
    memory_total: int | None = None      # bytes
    memory_used: int | None = None       # bytes in use (macOS: app + wired + compressed)
    gpu: GpuSample | None = None
    metrics: MetricsChunk | None = None  # asked with --metrics-from, and the file exists
    status: StatusAnswer | None = None   # asked with --status

    @classmethod
    def from_dict(cls, doc: Any) -> SampleAnswer:
        got = cls._fields(doc)
        for key, kind in (("gpu", GpuSample), ("metrics", MetricsChunk),
                          ("status", StatusAnswer)):
            if got.get(key) is not None:
                got[key] = kind.from_dict(got[key])
        return cls(**got)


Answer = (PreflightAnswer | SpawnAnswer | StatusAnswer | StopAnswer | LogsAnswer
          | KeepCheckpointsAnswer | ReadyAnswer | ReachAnswer | SampleAnswer)
ANSWERS: dict[str, type[_Answer]] = {
    PREFLIGHT: PreflightAnswer, SPAWN: SpawnAnswer, STATUS: StatusAnswer, STOP: StopAnswer,
    LOGS: LogsAnswer, KEEP_CHECKPOINTS: KeepCheckpointsAnswer,
    READY: ReadyAnswer, REACH: ReachAnswer,
    SAMPLE: SampleAnswer,
}


def answer_line(answer: _Answer) -> str:
    """What the node prints: the answer as one line of JSON."""
    return json.dumps(answer.to_dict())


def parse_answer(command: str, line: str) -> Any:
    """The controller's reading of ``command``'s answer line; ProtocolError if unreadable."""
    try:
        doc = json.loads(line)
    except ValueError as exc:
        raise ProtocolError(f"{command}: not JSON: {line[-200:]!r}") from exc
    from mlxops.node import benchproto  # the bench's answers (it imports this module)

    try:
        return {**ANSWERS, **benchproto.ANSWERS}[command].from_dict(doc)
    except ProtocolError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ProtocolError(f"{command}: unreadable answer: {exc!r}") from exc
