"""``python -m mlxops.node COMMAND ...``: what the controller asks a node; one JSON answer.

The commands, their arguments and their answers are :mod:`mlxops.node.protocol`'s (for
people: docs/node-protocol.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mlxops.node import protocol
from mlxops.node.protocol import bench as benchproto
from mlxops.node.protocol import content as contentproto
from mlxops.node.protocol import parts as partsproto
from mlxops.node.protocol import send as sendproto
from mlxops.node.protocol.calibration import READ_CALIBRATION

# Each command imports only its own module, where it answers: the watchdog asks every node
# for a `sample` or a `status` every poll, and importing every command's module (pre-flight's
# importlib.metadata, the content hashes, ...) took half of such a command's CPU (73 of
# ~90 ms on this machine), the node's CPU that the ranks beside it train with.


def answer(args: argparse.Namespace) -> protocol.Answer:
    """The answer to one command line (as a protocol ``*_args`` function built it, parsed
    once by :func:`main`: building the parser of every command is a few ms of a helper's
    ~60)."""
    if args.cmd == protocol.READY:
        from mlxops.node.ready import ready

        return ready(Path(args.root), ip=args.ip, ports=args.ports, mpi=args.mpi)
    if args.cmd == protocol.REACH:
        from mlxops.node.reach import reach

        return reach(args.name, args.ip, args.ports, protocol.parse_peers(args.peers),
                     args.seconds)
    if args.cmd in benchproto.COMMANDS:
        return bench_answer(args)
    if args.cmd == contentproto.CONTENT:
        from mlxops.node.content import listing

        return listing(Path(args.dir), Path(args.cache), args.hash)
    if args.cmd in partsproto.COMMANDS:
        return parts_answer(args)
    if args.cmd == protocol.SAMPLE:
        from mlxops.node.sample import sample

        return sample(Path(args.run_dir) if args.run_dir else None, with_status=args.status,
                      metrics_from=args.metrics_from, metrics_inode=args.metrics_inode,
                      max_bytes=args.max_bytes)
    run_dir = Path(args.run_dir)
    if args.cmd == READ_CALIBRATION:
        from mlxops.node.calibration import read_calibration

        return read_calibration(run_dir)
    if args.cmd == protocol.PREFLIGHT:
        from mlxops.node.preflight import preflight

        return preflight(run_dir, ip=args.ip, ports=args.ports, mpi=args.mpi)
    if args.cmd == protocol.SPAWN:
        from mlxops.node.spawn import spawn_job

        return spawn_job(run_dir, args.ranks, args.launcher)
    if args.cmd == protocol.STATUS:
        from mlxops.node.status import status

        return status(run_dir, requests=args.requests)
    if args.cmd == protocol.STOP:
        from mlxops.node.ports import busy_ports
        from mlxops.node.stop import stop

        stopped = stop(run_dir, args.grace)
        stopped.ports_busy = busy_ports(args.ip, args.ports) if args.ip else []
        return stopped
    if args.cmd == protocol.LOGS:
        from mlxops.node.logs import read_logs

        return read_logs(run_dir, rank=args.rank, offsets=protocol.parse_offsets(args.offsets),
                         tail=args.tail, max_bytes=args.max_bytes)
    from mlxops.node.rundir import keep_checkpoints_up_to

    return protocol.KeepCheckpointsAnswer(keep_checkpoints_up_to(run_dir, args.step))


def parts_answer(args: argparse.Namespace) -> protocol.Answer:
    """A run's checkpoint parts (``mlxops.node.protocol.parts``): listed, or received from
    stdin; a receive that fails places nothing and exits 1 with one line on stderr."""
    from mlxops.node import ckptparts

    if args.cmd == partsproto.PARTS:
        return ckptparts.list_parts(Path(args.run_dir))
    try:
        return ckptparts.receive(Path(args.run_dir), args.parts,
                                 partsproto.parse_files(args.files), sys.stdin.buffer)
    except (OSError, ValueError, ckptparts.ReceiveError) as exc:
        raise SystemExit(f"mlxops.node receive: {exc}") from None


def bench_answer(args: argparse.Namespace) -> protocol.Answer:
    """The bench's commands (``mlxops.node.protocol.bench``)."""
    from mlxops.node import netclient, netserver  # only the bench needs them

    try:
        if args.cmd == benchproto.BENCH_SERVE:
            return netserver.serve(Path(args.run_dir), ip=args.ip, port=args.port,
                                   deadline=args.deadline, iperf3_port=args.iperf3_port)
        if args.cmd == benchproto.BENCH_STOP:
            return netserver.stop_server(Path(args.run_dir))
        return netclient.client(peer=args.peer, port=args.port, latency=args.latency,
                                modes=args.modes, streams=args.streams,
                                seconds=args.seconds, omit=args.omit,
                                iperf3_port=args.iperf3_port,
                                latency_seconds=args.latency_seconds)
    except (OSError, ValueError) as exc:
        # A measurement that could not be made (a peer gone, a port taken): one line on
        # stderr, exit 1; the controller reports it as the host's failure.
        raise SystemExit(f"mlxops.node {args.cmd}: {type(exc).__name__}: {exc}") from None


def main(argv: list[str] | None = None) -> int:
    args = protocol.parser().parse_args(argv)
    if args.cmd == protocol.WATCH:  # a stream of messages, not one answer
        from mlxops.node.watch import watch

        return watch(Path(args.run_dir), tick=args.tick, beat=args.beat)
    if args.cmd == sendproto.SEND:  # an answer line, then a tar of files
        from mlxops.node.send import send

        return send(sys.stdout.buffer, directory=args.dir, run_dir=args.run_dir,
                    where=args.where, step=args.step, names=args.files)
    sys.stdout.write(protocol.answer_line(answer(args)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
