"""Benchmark: ``mlxops provision`` with nothing to change, against the floor of one SSH
round trip per host, on N sandbox nodes (needs root).

In the same run, interleaved, median of ``--repeat``:

- floor: ``ssh -F <sandbox ssh_config> NODE true`` to every node at once (OpenSSH
  processes in parallel, the least any tool can do: one connection and one command per
  host), and ``mlxops run INV -- true`` (the same through mlxops' CLI and transport);
- ``mlxops provision INV`` re-run on provisioned nodes (nothing changes), and with
  ``--check``;
- a cold ``mlxops provision`` (the node root removed first).

``--baseline DIR``: another checkout of mlxops (e.g. ``git archive <commit> | tar -x -C
DIR``) timed the same way beside this one, to compare a change's cold and no-op runs.

    sudo .venv/bin/python benchmarks/provision_noop.py --nodes 16 [--repeat 5]
         [--baseline DIR] [--subnet 10.244.11.0/24]

Targets (issue 21): the no-op re-run within 1.5x of the floor, ``--check`` the same, cold
runs no slower than before.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from timing import timed

from mlxops.sandbox import Sandbox

ROOT = ".bench-noop"
# Runs mlxops from another checkout: its directory first on sys.path, this checkout's
# editable-install finder out of the way.
BASELINE = ("import runpy, sys; "
            "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f)]; "
            "sys.path.insert(0, sys.argv.pop(1)); sys.argv[0] = 'mlxops'; "
            "runpy.run_module('mlxops', run_name='__main__')")


def ssh_floor(box: Sandbox) -> float:
    """One ``true`` over OpenSSH to every node at once."""
    start = time.perf_counter()
    procs = [subprocess.Popen(["ssh", "-F", str(box.ssh_config_path), "-o", "BatchMode=yes",
                               node, "true"], stdin=subprocess.DEVNULL)
             for node in box.nodes]
    codes = [p.wait() for p in procs]
    took = time.perf_counter() - start
    if any(codes):
        sys.exit(f"ssh floor failed: exit codes {codes}")
    return took


def changed(out: str) -> int:
    return sum(h["changed"] for h in json.loads(out)["hosts"].values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--baseline", type=Path, default=None,
                        help="another mlxops checkout to time beside this one")
    parser.add_argument("--subnet", default="10.244.11.0/24")
    opts = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="mlxops-bench-noop-"))
    work.chmod(0o755)
    box = Sandbox(work / "sandbox", prefix="mxnoop", subnet=opts.subnet)
    print(f"starting {opts.nodes} sandbox nodes ...", file=sys.stderr)
    box.up(opts.nodes)
    try:
        doc = yaml.safe_load(box.inventory_path.read_text())
        doc["all"]["vars"]["mlxops_root"] = f"~/{ROOT}"
        inv = work / "inventory.yml"
        inv.write_text(yaml.safe_dump(doc, sort_keys=False))
        env = {**os.environ, "MLXOPS_HOME": str(work / "home")}
        env.pop("MLXOPS_DEBUG", None)
        tools = {"mlxops": [sys.executable, "-m", "mlxops"]}
        if opts.baseline:
            tools["baseline"] = [sys.executable, "-c", BASELINE, str(opts.baseline.resolve())]
        runs: dict[str, list[float]] = {}

        def record(name: str, seconds: float) -> None:
            runs.setdefault(name, []).append(seconds)

        def clear() -> None:
            for node in box.nodes:
                shutil.rmtree(box.node_home(node) / ROOT, ignore_errors=True)

        provision = {t: [*argv, "provision", str(inv), "--json"] for t, argv in tools.items()}
        for argv in provision.values():  # untimed: bytecode, page cache, the code synced
            clear()
            timed(argv, env)
        for _ in range(opts.repeat):
            record("floor: ssh NODE true, every node at once", ssh_floor(box))
            record("floor: mlxops run INV -- true",
                   timed([*tools["mlxops"], "run", str(inv), "--", "true"], env)[0])
            for tool, argv in provision.items():
                clear()
                took, out = timed(argv, env)
                record(f"{tool} provision, cold", took)
                assert changed(out) > 0
                took, out = timed(argv, env)
                record(f"{tool} provision, nothing to change", took)
                assert changed(out) == 0, f"{tool}: the re-run changed something"
                took, out = timed([*argv, "--check"], env)
                record(f"{tool} provision --check, nothing to change", took)
                assert changed(out) == 0
    finally:
        box.down()
        shutil.rmtree(work, ignore_errors=True)
    median = {name: statistics.median(values) for name, values in runs.items()}
    floor = median["floor: ssh NODE true, every node at once"]
    cli_floor = median["floor: mlxops run INV -- true"]
    print(f"\nprovision with nothing to change, {opts.nodes} sandbox nodes, "
          f"{os.cpu_count()} cores, median of {opts.repeat}\n")
    print(f"{'':48} {'s':>6} {'x ssh floor':>12} {'x run floor':>12}")
    for name, seconds in median.items():
        print(f"{name:48} {seconds:6.2f} {seconds / floor:11.2f}x {seconds / cli_floor:11.2f}x")
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
