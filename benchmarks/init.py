"""Benchmark: ``mlxops init`` from start to the written files, against ``mlxops trust`` on
the same N sandbox nodes (needs root).

In the same run, interleaved, median of ``--repeat``, each run with a fresh, empty
known_hosts (every key new) and a fresh controller home:

- ``mlxops trust INV --yes``: the sandbox's inventory, its ``mlxops_known_hosts`` pointed at
  the empty file: scan every key, show it, record it;
- ``mlxops init --all --accept-new-host-keys``: the same nodes found over mDNS (listening
  until ``--browse-quiet`` passed after the last new answer, ``--browse-seconds`` at
  most); from the moment its answer is heard, while the listening goes on, each host's
  connection opened once (its key judged and recorded as it opens) and one probe command
  run over it (facts, hardware ports, addresses, an interpreter with mlx, the peers
  tried); then the links, the inventory and the job written;
- ``mlxops init NODE_IP...``: the same with the nodes named (no mDNS listening).

    sudo .venv/bin/python benchmarks/init.py --nodes 16 [--repeat 3] [--browse-seconds 1]
         [--browse-quiet 0.5] [--subnet 10.244.32.0/24] [--baseline DIR]

``--baseline DIR``: a checkout of another commit (``git worktree add DIR COMMIT``, or
``git archive COMMIT mlxops | tar -x -C DIR``) whose ``init --all`` and ``init NODE_IP...``
are timed in the same rounds (its ``mlxops`` first on ``PYTHONPATH``): a change's before
and after under one load.

Target (issue 32): init within 2x of trust.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import yaml
from timing import timed

from mlxops.sandbox import Sandbox


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--browse-seconds", type=float, default=1.0)
    parser.add_argument("--browse-quiet", type=float, default=0.5)
    parser.add_argument("--subnet", default="10.244.32.0/24")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="a checkout whose init --all is timed in the same rounds")
    opts = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="mlxops-bench-init-"))
    work.chmod(0o755)
    box = Sandbox(work / "sandbox", prefix="mxinit", subnet=opts.subnet)
    print(f"starting {opts.nodes} sandbox nodes ...", file=sys.stderr)
    box.up(opts.nodes)
    runs: dict[str, list[float]] = {}
    try:
        mlxops = [sys.executable, "-m", "mlxops"]
        common = ["--user", box.user, "--key", str(box.key_path), "--python", box.python]
        ips = list(box.info.nodes.values())

        def fresh(tag: str, i: int) -> tuple[Path, dict[str, str]]:
            d = work / f"{tag}-{i}"
            d.mkdir()
            return d, {**os.environ, "MLXOPS_HOME": str(d / "home")}

        def trust(i: int) -> float:
            d, env = fresh("trust", i)
            doc = yaml.safe_load(box.inventory_path.read_text())
            doc["all"]["vars"]["mlxops_known_hosts"] = str(d / "known_hosts")
            (d / "inventory.yml").write_text(yaml.safe_dump(doc))
            return timed([*mlxops, "trust", str(d / "inventory.yml"), "--yes"], env)[0]

        def init(i: int, named: bool, baseline: Path | None = None) -> float:
            d, env = fresh(("named" if named else "found") + ("-base" if baseline else ""), i)
            command = mlxops
            if baseline is not None:  # -P: not the current directory's mlxops first
                env["PYTHONPATH"] = f"{baseline.resolve()}:{env.get('PYTHONPATH', '')}"
                command = [sys.executable, "-P", "-m", "mlxops"]
            where = ips if named else ["--all", "--interface", box.controller_ip,
                                       "--browse-seconds", str(opts.browse_seconds),
                                       "--browse-quiet", str(opts.browse_quiet)]
            took = timed([*command, "init", *where, "-o", str(d / "inventory.yml"),
                          "--accept-new-host-keys", "--known-hosts", str(d / "known_hosts"),
                          *common], env)[0]
            written = yaml.safe_load((d / "inventory.yml").read_text())
            hosts = [h for g in written["all"]["children"].values() for h in g["hosts"]]
            assert len(hosts) == opts.nodes, hosts
            return took

        load_start = os.getloadavg()[0]
        trust(-1)  # untimed: bytecode and page cache
        init(-1, True)
        if opts.baseline is not None:
            init(-1, True, opts.baseline)
        for i in range(opts.repeat):
            runs.setdefault("mlxops trust INV --yes", []).append(trust(i))
            runs.setdefault(f"mlxops init --all (mDNS, quiet {opts.browse_quiet:g} s, "
                            f"<= {opts.browse_seconds:g} s)", []).append(init(i, False))
            runs.setdefault("mlxops init NODE... (named)", []).append(init(i, True))
            if opts.baseline is not None:
                runs.setdefault(f"the same --all, {opts.baseline.name}'s mlxops",
                                []).append(init(i, False, opts.baseline))
                runs.setdefault(f"the same named, {opts.baseline.name}'s mlxops",
                                []).append(init(i, True, opts.baseline))
    finally:
        box.down()
        shutil.rmtree(work, ignore_errors=True)
    median = {name: statistics.median(values) for name, values in runs.items()}
    trust_runs = runs["mlxops trust INV --yes"]
    base = median["mlxops trust INV --yes"]
    print(f"\nfrom start to written files, {opts.nodes} sandbox nodes, {os.cpu_count()} cores, "
          f"median of {opts.repeat}; 'x trust' is the ratio of the medians, 'per round' the "
          "median of each round's ratio (init over the trust run just before it: the load "
          "drifts less within a round)\n")
    print(f"{'':48} {'s':>6} {'x trust':>8} {'per round':>10}")
    for name, seconds in median.items():
        rounds = statistics.median(v / t for v, t in zip(runs[name], trust_runs, strict=True))
        print(f"{name:48} {seconds:6.2f} {seconds / base:7.2f}x {rounds:9.2f}x")
    print(f"\nload average: {load_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
