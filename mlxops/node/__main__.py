"""``python -m mlxops.node COMMAND ...``: what the controller asks a node; one JSON answer."""

from __future__ import annotations

import argparse
import ctypes.util
import json
import os
import platform
import shutil
import subprocess
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
        launcher = ranks.launcher_status(run_dir, 0.0)
        if launcher and launcher["alive"]:
            leftovers.append({"rank": ranks.LAUNCHER, "pid": launcher["pid"]})
    mpi = _open_mpi() if args.mpi else {}
    return {**mpi,
        "python": sys.executable,
        "python_version": platform.python_version(),
        "mlx": mlx_version,
        "system": platform.system(),
        "ports_busy": ports.busy_ports(args.ip, args.ports) if args.ip else [],
        "leftovers": leftovers,
        "checkpoints": ranks.checkpoint_steps(run_dir),
    }


# Where Open MPI lives when a non-interactive SSH session's PATH lacks it (Homebrew on
# Apple Silicon and on Intel, MacPorts).
MPI_DIRS = ("/opt/homebrew/bin", "/usr/local/bin", "/opt/local/bin")


def _open_mpi() -> dict:
    """mpirun's absolute path, and the libmpi MLX should dlopen (as mlx.launch finds it:
    the libmpi that ``ompi_info`` links, by ldd or otool), else ``find_library``."""
    search = os.pathsep.join([os.environ.get("PATH", ""), *MPI_DIRS])
    mpirun = shutil.which("mpirun", path=search)
    libname = None
    if mpirun:
        ompi_info = Path(mpirun).with_name("ompi_info")
        tool = ["otool", "-L"] if platform.system() == "Darwin" else ["ldd"]
        try:
            out = subprocess.run([*tool, str(ompi_info)], capture_output=True, text=True,
                                 timeout=20, check=False).stdout
            line = next(x for x in out.splitlines() if "libmpi" in x)
            libname = line.strip().split()[0].removeprefix("@rpath/")
        except (OSError, StopIteration, subprocess.SubprocessError):
            libname = ctypes.util.find_library("mpi")
    return {"mpirun": mpirun, "mpi_libname": libname}


def _spawn(args: argparse.Namespace) -> dict:
    run_dir = Path(args.run_dir)
    ranks.clear_stopped(run_dir)
    answer = {"pids": {str(r): ranks.spawn(run_dir, r) for r in args.ranks}}
    if args.launcher:
        answer["launcher"] = ranks.spawn_script(run_dir, ranks.LAUNCHER)
    return answer


def _logs(args: argparse.Namespace) -> dict:
    """New bytes of each log since the offsets the controller already has.

    Keys are rank numbers, plus ``launcher`` (mpirun's own log, on an mpi job's first host)
    when the whole job is asked for.
    """
    run_dir = Path(args.run_dir)
    offsets = dict(item.split(":") for item in args.offsets) if args.offsets else {}
    logs = {str(r): run_dir / f"rank-{r}.log" for r in ranks.ranks_in(run_dir)
            if args.rank is None or r == args.rank}
    if args.rank is None and (run_dir / "launcher.log").exists():
        logs["launcher"] = run_dir / "launcher.log"
    out = {}
    for key, path in logs.items():
        start = int(offsets.get(key, 0))
        data = b""
        if path.exists():
            with open(path, "rb") as f:
                size = f.seek(0, 2)
                if args.tail and not offsets:
                    start = max(0, size - args.tail)
                f.seek(start if start <= size else 0)
                data = f.read(args.max_bytes)
                start = f.tell()
        out[key] = {"text": data.decode(errors="replace"), "offset": start}
    return {"logs": out}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mlxops.node")
    sub = p.add_subparsers(dest="cmd", required=True)
    pre = sub.add_parser("preflight")
    pre.add_argument("--run-dir", required=True)
    pre.add_argument("--ip", default="")
    pre.add_argument("--ports", type=int, nargs="*", default=[])
    pre.add_argument("--mpi", action="store_true", help="also find mpirun and libmpi")
    sp = sub.add_parser("spawn")
    sp.add_argument("--run-dir", required=True)
    sp.add_argument("--ranks", type=int, nargs="*", default=[])
    sp.add_argument("--launcher", action="store_true",
                    help="also start launcher.sh (mpirun of an mpi job)")
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
    lg.add_argument("--offsets", nargs="*", default=[], help="rank:byte_offset ... "
                    "(launcher:byte_offset for mpirun's log)")
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
