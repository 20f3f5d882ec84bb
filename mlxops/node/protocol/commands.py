"""The node's commands: ``python -m mlxops.node COMMAND --run-dir DIR ...``. The controller
builds each argument list with the function below the command's name, the node parses it
with :func:`parser`; nothing else spells a flag."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any

from mlxops.node.protocol import bench, calibration, content, parts, send
from mlxops.node.protocol.layout import LAUNCHER

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


def status_args(run_dir: str, *, requests: bool = False) -> list[str]:
    """``requests``: a serve job's; rank 0 also counts the requests its server answered."""
    return [STATUS, "--run-dir", run_dir, *(["--requests"] if requests else [])]


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


# The watch channel (``mlxops.node.protocol.channel``): a long-lived command, one per host
# of a supervised job, that prints a message whenever a rank starts, exits or vanishes, and
# at least every BEAT seconds; it ends when its stdin ends.
WATCH = "watch"
#: Seconds between the helper's looks at the run directory (on the node: a few stat calls).
TICK = 0.05
#: The helper sends the host's status at least this often, changed or not.
BEAT = 1.0
#: Seconds of silence after which the controller counts a channel as lost: three beats,
#: so one late beat on a busy node (a compile, a checkpoint on a slow disk) is not a loss.
LOST_AFTER = 3 * BEAT


def watch_args(run_dir: str, *, tick: float = TICK, beat: float = BEAT) -> list[str]:
    """Watch ``run_dir`` until stdin ends: look every ``tick`` s, send at least every ``beat``."""
    return [WATCH, "--run-dir", run_dir, "--tick", str(tick), "--beat", str(beat)]


def _add_channel_parser(sub: Any) -> None:
    watch = sub.add_parser(WATCH)
    watch.add_argument("--run-dir", required=True)
    watch.add_argument("--tick", type=float, default=TICK)
    watch.add_argument("--beat", type=float, default=BEAT)


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
    commands[STATUS].add_argument("--requests", action="store_true",
                                  help="a serve job: count rank 0's answered requests")
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
    bench.add_parsers(sub)
    calibration.add_parsers(sub)
    content.add_parsers(sub)
    parts.add_parsers(sub)
    send.add_parsers(sub)
    _add_monitor_parsers(sub)
    _add_channel_parser(sub)
    return p

