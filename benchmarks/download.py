"""Benchmark: the controller's peak memory (and the time) bringing one large file from a
node, three ways, on one sandbox node (needs root):

- ``stream``: mlxops' download (``jobs/download.py``: the node's ``send`` command, its tar
  read off the SSH channel as it comes and written to disk a buffer at a time), what
  ``mlxops fetch`` and ``mlxops export`` use now;
- ``base64``: what they did before (one command, ``tar | base64``, its whole output held as
  text, decoded, unpacked from memory), on the same connection;
- ``scp``: OpenSSH's ``scp`` with the sandbox's ssh_config (the floor: a C client).

Each runs in a process of its own, which reports its peak RSS (``ru_maxrss``) and its RSS
before the transfer (Python, paramiko and mlxops imported, connected); ``scp`` reports its
child's peak. Alternating order over ``--repeat`` rounds; medians.

    sudo .venv/bin/python benchmarks/download.py [--size-mb 1024] [--repeat 2]
         [--subnet 10.244.13.0/24]
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WHERE = "bench-download"   # under the node user's home


def child(method: str, inventory: str, ssh_config: str, python: str, code: str,
          target: Path) -> dict:
    """One transfer in this process; what it cost."""
    if method == "scp":
        start = time.perf_counter()
        subprocess.run(["scp", "-q", "-F", ssh_config, f"node1:{WHERE}/big", str(target)],
                       check=True)
        took = time.perf_counter() - start
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        return {"seconds": took, "peak_kb": peak, "base_kb": 0}
    import base64
    import io
    import tarfile

    from mlxops.inventory import load_inventory
    from mlxops.jobs.download import download, send_command
    from mlxops.node.protocol.send import send_args
    from mlxops.transport import Connector

    with Connector() as connector:
        conn = connector.connect(load_inventory(inventory).hosts["node1"])
        home = conn.run("pwd").stdout.strip()
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        start = time.perf_counter()
        if method == "stream":
            got, result = download(conn, send_command(python, code, send_args(
                f"{home}/{WHERE}", ["big"])), target.parent)
            assert result.ok and got.written["big"] > 0, result.error_line()
        else:
            result = conn.run(f"tar -cf - -C {home}/{WHERE} big | base64", timeout=3600)
            assert result.ok, result.error_line()
            with tarfile.open(fileobj=io.BytesIO(base64.b64decode(result.stdout))) as tar:
                member = tar.getmember("big")
                target.write_bytes(tar.extractfile(member).read())
        took = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"seconds": took, "peak_kb": peak, "base_kb": base}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--subnet", default="10.244.13.0/24")
    parser.add_argument("--ways", default="stream,base64,scp",
                        help="which of stream, base64, scp (scp is the ratios' base)")
    parser.add_argument("--child", nargs=6, default=None, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child:
        method, inventory, ssh_config, python, code, target = opts.child
        print(json.dumps(child(method, inventory, ssh_config, python, code, Path(target))))
        return

    from mlxops.inventory import load_inventory
    from mlxops.sandbox import Sandbox
    from mlxops.sync import bundle, sync_files
    from mlxops.transport import Connector

    work = Path(tempfile.mkdtemp(prefix="mlxops-bench-download-"))
    work.chmod(0o755)
    box = Sandbox(work / "sandbox", prefix="mxdl", subnet=opts.subnet)
    print("starting 1 sandbox node ...", file=sys.stderr)
    box.up(1)
    runs: dict[str, list[dict]] = {way: [] for way in opts.ways.split(",")}
    if "scp" not in runs:
        sys.exit("--ways: scp is the base of the ratios")
    try:
        with Connector() as connector:
            conn = connector.connect(load_inventory(box.inventory_path).hosts["node1"])
            home = conn.run("pwd").stdout.strip()
            code = f"{home}/.mlxops/code"
            files, roots, ignore = bundle(None, None)
            sync_files(conn, files, code, roots=roots, ignore=ignore, python=box.python)
            made = conn.run(f"mkdir -p {WHERE} && head -c {opts.size_mb}M /dev/urandom "
                            f"> {WHERE}/big", timeout=3600)
            assert made.ok, made.error_line()
        order = list(runs)
        for round_ in range(opts.repeat):
            for method in (order if round_ % 2 == 0 else order[::-1]):
                out = work / f"out-{method}"
                shutil.rmtree(out, ignore_errors=True)
                out.mkdir()
                done = subprocess.run(
                    [sys.executable, __file__, "--child", method, str(box.inventory_path),
                     str(box.ssh_config_path), box.python, code, str(out / "big")],
                    capture_output=True, text=True, check=True)
                runs[method].append(json.loads(done.stdout.strip().splitlines()[-1]))
                assert (out / "big").stat().st_size == opts.size_mb << 20, method
                shutil.rmtree(out)
    finally:
        box.down()
        shutil.rmtree(work, ignore_errors=True)

    def med(method: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[method])

    print(f"one {opts.size_mb} MB file from a sandbox node, median of {opts.repeat}")
    print(f"{'':8} {'peak RSS MB':>12} {'of which transfer':>18} {'s':>7} "
          f"{'peak x scp':>11} {'s x scp':>8}")
    for method in runs:
        peak, base = med(method, "peak_kb") / 1024, med(method, "base_kb") / 1024
        print(f"{method:8} {peak:12.0f} {peak - base if base else peak:18.0f} "
              f"{med(method, 'seconds'):7.2f} "
              f"{med(method, 'peak_kb') / med('scp', 'peak_kb'):11.1f} "
              f"{med(method, 'seconds') / med('scp', 'seconds'):8.2f}")


if __name__ == "__main__":
    main()
