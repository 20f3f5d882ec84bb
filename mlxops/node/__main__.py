"""``python -m mlxops.node COMMAND ...``: what the controller asks a node; one JSON answer."""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

from mlxops.node import ports, ranks


def _preflight(args: argparse.Namespace) -> dict:
    try:
        import mlx.core as mx

        mlx_version = mx.__version__
    except ImportError:
        mlx_version = None
    run_dir = Path(args.run_dir)
    leftovers = []
    if run_dir.is_dir():
        for rank in ranks.ranks_in(run_dir):
            st = ranks.rank_status(run_dir, rank, 0.0)
            if st["alive"]:
                leftovers.append({"rank": rank, "pid": st["pid"]})
    return {
        "python": sys.executable,
        "python_version": platform.python_version(),
        "mlx": mlx_version,
        "system": platform.system(),
        "ports_busy": ports.busy_ports(args.ip, args.ports) if args.ip else [],
        "leftovers": leftovers,
        "checkpoints": ranks.checkpoint_steps(run_dir),
    }


def _spawn(args: argparse.Namespace) -> dict:
    run_dir = Path(args.run_dir)
    ranks.clear_stopped(run_dir)
    return {"pids": {str(r): ranks.spawn(run_dir, r) for r in args.ranks}}


def _logs(args: argparse.Namespace) -> dict:
    """New bytes of each rank's log since the offsets the controller already has."""
    run_dir = Path(args.run_dir)
    offsets = dict(item.split(":") for item in args.offsets) if args.offsets else {}
    out = {}
    for rank in ranks.ranks_in(run_dir):
        if args.rank is not None and rank != args.rank:
            continue
        path = run_dir / f"rank-{rank}.log"
        start = int(offsets.get(str(rank), 0))
        data = b""
        if path.exists():
            with open(path, "rb") as f:
                size = f.seek(0, 2)
                if args.tail and not offsets:
                    start = max(0, size - args.tail)
                f.seek(start if start <= size else 0)
                data = f.read(args.max_bytes)
                start = f.tell()
        out[str(rank)] = {"text": data.decode(errors="replace"), "offset": start}
    return {"logs": out}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mlxops.node")
    sub = p.add_subparsers(dest="cmd", required=True)
    pre = sub.add_parser("preflight")
    pre.add_argument("--run-dir", required=True)
    pre.add_argument("--ip", default="")
    pre.add_argument("--ports", type=int, nargs="*", default=[])
    sp = sub.add_parser("spawn")
    sp.add_argument("--run-dir", required=True)
    sp.add_argument("--ranks", type=int, nargs="+", required=True)
    st = sub.add_parser("status")
    st.add_argument("--run-dir", required=True)
    stop = sub.add_parser("stop")
    stop.add_argument("--run-dir", required=True)
    stop.add_argument("--grace", type=float, default=5.0)
    stop.add_argument("--ip", default="")
    stop.add_argument("--ports", type=int, nargs="*", default=[])
    lg = sub.add_parser("logs")
    lg.add_argument("--run-dir", required=True)
    lg.add_argument("--rank", type=int)
    lg.add_argument("--offsets", nargs="*", default=[], help="rank:byte_offset ...")
    lg.add_argument("--tail", type=int, default=0, help="start this many bytes from the end")
    lg.add_argument("--max-bytes", type=int, default=1 << 20)
    ck = sub.add_parser("keep-checkpoints")
    ck.add_argument("--run-dir", required=True)
    ck.add_argument("--step", type=int, required=True)
    args = p.parse_args(argv)

    run_dir = Path(args.run_dir)
    if args.cmd == "preflight":
        answer = _preflight(args)
    elif args.cmd == "spawn":
        answer = _spawn(args)
    elif args.cmd == "status":
        answer = ranks.status(run_dir)
    elif args.cmd == "stop":
        answer = ranks.stop(run_dir, args.grace)
        answer["ports_busy"] = ports.busy_ports(args.ip, args.ports) if args.ip else []
    elif args.cmd == "logs":
        answer = _logs(args)
    else:  # keep-checkpoints
        answer = {"removed": ranks.keep_checkpoints_up_to(run_dir, args.step)}
    json.dump(answer, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
