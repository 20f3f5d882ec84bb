"""Benchmark: the CPU one facts command costs a node, beside a bare login (needs root).

One sandbox node (``--login-shell`` bash or zsh); its sshd is moved into a cgroup of its
own (cgroup v1's ``cpuacct`` or v2's ``cpu.stat``) before any login, so every session it
forks, the login shell and every process the command starts are counted there, grandchildren
included -- which sshd's own ``cutime`` does not show (its per-connection process does not
reap the session's shell). Interleaved, ``--repeat`` rounds of ``--runs`` logins each:

- ``ssh NODE true``: a login (sshd's session, the login shell) and nothing else;
- ``ssh NODE FACTS``: the command ``mlxops init`` sends (:func:`mlxops.init.probe.probe`'s
  form: the facts script, init's reads in the same interpreter, 15 peer addresses tried).

The facts command's own CPU is the second less the first. On a real cluster each Mac pays
this on its own cores; in the sandbox 16 nodes pay it on the controller's.

    sudo .venv/bin/python benchmarks/facts_cpu.py [--runs 20] [--repeat 3] [--login-shell bash]
                                                  [--flavour linux|macos]
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

from mlxops.init.probe import CANDIDATES, probe_reads
from mlxops.sandbox import Sandbox
from mlxops.tasks.facts import facts_script


class CpuGroup:
    """A cgroup that counts the CPU of what is moved into it and of its descendants."""

    def __init__(self, name: str) -> None:
        v1 = Path("/sys/fs/cgroup/cpuacct")
        self.path = (v1 if (v1 / "cpuacct.usage").exists() else Path("/sys/fs/cgroup")) / name
        self.path.mkdir(exist_ok=True)

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def seconds(self) -> float:
        if (self.path / "cpuacct.usage").exists():
            return int((self.path / "cpuacct.usage").read_text()) / 1e9
        stat = dict(line.split() for line in (self.path / "cpu.stat").read_text().splitlines())
        return int(stat["usage_usec"]) / 1e6

    def remove(self) -> None:
        """After the node's sshd is gone: a session still exiting keeps the group busy
        (EBUSY) for a moment."""
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)
        print(f"left behind: {self.path} (remove it with rmdir)", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--login-shell", choices=("bash", "zsh"), default="bash")
    parser.add_argument("--flavour", choices=("linux", "macos"), default="linux",
                        help="macos: a Mac-like node, whose macOS tools are Python shims")
    parser.add_argument("--subnet", default="10.244.33.0/24")
    opts = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="mlxops-bench-facts-"))
    work.chmod(0o755)
    box = Sandbox(work / "sandbox", prefix="mxfcpu", subnet=opts.subnet,
                  login_shell=opts.login_shell, flavour=opts.flavour)
    box.up(1)
    state = json.loads((work / "sandbox" / "state.json").read_text())
    pid = state["nodes"][0]["sshd_pid"]
    group = CpuGroup(f"mlxops-bench-facts-{os.getpid()}")
    group.add(pid)
    # 15 peers, as on 16 nodes: the controller's bridge address 15 times (its closed
    # port 9 answers with the kernel's refusal, as a peer's does).
    peers = (f"{opts.subnet.rsplit('.', 1)[0]}.1",) * 15
    facts = facts_script(state["python"], "~/.mlxops",
                         probe_reads([state["python"], *CANDIDATES], peers))
    ssh = ["ssh", "-F", str(box.ssh_config_path), "node1"]
    per_run: dict[str, list[float]] = {"login (true)": [], "login + facts": []}
    load_start = os.getloadavg()[0]
    try:
        for _ in range(opts.repeat):
            for name, command in (("login (true)", "true"), ("login + facts", facts)):
                before = group.seconds()
                for _ in range(opts.runs):
                    subprocess.run([*ssh, command], check=True, capture_output=True,
                                   stdin=subprocess.DEVNULL)
                per_run[name].append((group.seconds() - before) / opts.runs * 1000)
    finally:
        box.down()
        group.remove()
        shutil.rmtree(work, ignore_errors=True)
    login = statistics.median(per_run["login (true)"])
    both = statistics.median(per_run["login + facts"])
    print(f"\nCPU on the node per login, ms ({opts.flavour} {opts.login_shell} node, median of "
          f"{opts.repeat} rounds of {opts.runs})")
    print(f"  login (true)     {login:6.1f}")
    print(f"  login + facts    {both:6.1f}  ({both / login:.2f}x the login)")
    print(f"  facts command    {both - login:6.1f}")
    print(f"load average: {load_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end",
          file=sys.stderr)


if __name__ == "__main__":
    main()
