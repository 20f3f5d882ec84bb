"""Benchmark: kill -9 of one rank to every other rank stopped, and to the resume under way.

On its own sandbox (``--nodes`` fake nodes; needs root), the bundled trainer with a tiny
model at each ``--ranks`` world size (``mlxops_slots`` ranks a node), supervised by a
watchdog in this process (as ``mlxops launch`` runs it, on one shared Connector):

- ``push``: mlxops' watchdog (:func:`mlxops.jobs.watch.supervise`): each host's watch
  channel reports the rank's exit as it happens;
- ``poll``: the watchdog as it was before the channels, reproduced here: the ``status``
  of every host every ``restart.interval`` seconds (2 s at the default ``stall_timeout``
  of 60), and a restart when the status has a problem.

Once every rank ran step ``--after`` (and one checkpoint exists), one rank's trainer (the
last rank's, on the last node) is sent SIGKILL, and this machine (all nodes share its PID
namespace) watches every other rank's processes, every 5 ms: **decided** is when the
watchdog says it is restarting (it heard of the death); **stopped** is when the last of
the other ranks' processes is gone (at 4 ranks on a ring, peers often fail by themselves
first: their connection to the dead rank breaks); **resumed** is when every rank of the
new attempt has been spawned (its ``rank-<r>.pid`` rewritten after the kill). Targets:
stopped <= 1 s at 4 and 16 ranks, resumed <= 5 s. Median of ``--repeat`` runs per mode,
modes alternating.

    sudo .venv/bin/python benchmarks/watchdog.py [--nodes 4] [--ranks 4,16] [--repeat 3]
                                                 [--modes push,poll]

Every job is stopped and the sandbox taken down at the end, also on Ctrl-C; the work
directory is removed unless a run failed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml
from launch import free_subnet, kill

from mlxops.jobs.launch import launch
from mlxops.jobs.record import JobRecord, JobStopped, inventory_hosts, load_record
from mlxops.jobs.spec import load_job
from mlxops.jobs.status import job_status
from mlxops.jobs.stop import stop_job
from mlxops.jobs.watch import restart, supervise
from mlxops.node.protocol import RUNNING
from mlxops.sandbox import Sandbox, prerequisites
from mlxops.transport import Connector

POLL = 0.005
MODEL = {"dims": 32, "layers": 1, "heads": 2, "vocab_size": 256, "seq_len": 32}


def trainer_config(steps: int = 1_000_000) -> dict:
    return {"model": dict(MODEL), "data": {"source": "synthetic", "seed": 0},
            "train": {"steps": steps, "global_batch": 16, "micro_batch": 1, "lr": 3e-3,
                      "checkpoint_every": 2, "keep": 2, "log_every": 1000}}


def poll_watchdog(record: JobRecord, connector: Connector, done: threading.Event,
                  on_event) -> None:
    """The watchdog before the channels: a status poll of every host each interval."""
    hosts = inventory_hosts(record)
    while not done.is_set():
        status = job_status(record, connector, hosts=hosts)
        if status.problem:
            try:
                restart(record, connector, status.problem, on_event)
            except JobStopped:
                pass  # this benchmark stopped it once the new ranks were spawned
            return
        done.wait(record.restart.interval)


def push_watchdog(record: JobRecord, connector: Connector, done: threading.Event,
                  on_event) -> None:
    supervise(record, connector, on_event=on_event)


def children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


class Bench:
    def __init__(self, opts: argparse.Namespace) -> None:
        self.opts = opts
        self.work = Path(tempfile.mkdtemp(prefix="mlxops-bench-watchdog-", dir="/var/tmp"))
        self.work.chmod(0o755)
        os.environ["MLXOPS_HOME"] = str(self.work / "controller")
        pid = os.getpid()
        self.box = Sandbox(self.work / "sandbox", prefix=f"mxbw{pid % 100000}",
                           subnet=free_subnet(pid))
        self.connector = Connector()
        self.jobs: list[str] = []
        self.runs = 0

    def inventory(self, slots: int) -> Path:
        doc = yaml.safe_load(self.box.inventory_path.read_text())
        doc["all"]["vars"]["mlxops_slots"] = slots
        path = self.work / f"inventory-{slots}.yml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return path

    def run_dir(self, node: str, name: str) -> Path:
        return self.box.node_home(node) / ".mlxops" / "runs" / name

    def once(self, ranks: int, mode: str) -> tuple[float, float, float]:
        """Seconds from the kill to: the watchdog deciding to restart, every other rank
        stopped, the resume spawned."""
        slots = ranks // self.opts.nodes
        self.runs += 1
        name = f"wd-{self.runs}"
        job = {"name": name, "inventory": str(self.inventory(slots)), "hosts": "all",
               "backend": "ring", "trainer": trainer_config(),
               "restart": {"max_restarts": 1}}
        path = self.work / f"{name}.yml"
        path.write_text(yaml.safe_dump(job, sort_keys=False))
        self.jobs.append(name)
        record = launch(load_job(path), self.connector, fresh=True)
        done = threading.Event()
        heard: list[float] = []

        def on_event(text: str) -> None:
            if text.startswith("restarting") and not heard:
                heard.append(time.monotonic())

        target = push_watchdog if mode == "push" else poll_watchdog
        watchdog = threading.Thread(target=target, args=(record, self.connector, done, on_event),
                                    daemon=True)
        try:
            self.wait_step(record, self.opts.after)
            watchdog.start()
            time.sleep(2.0)  # the watchdog has its channels (push) or is between polls
            placement = [(r.rank, r.host) for r in record.ranks]
            victim_rank, victim_host = placement[-1]
            others = []
            for rank, host in placement[:-1]:
                pgid = int((self.run_dir(host, name) / f"rank-{rank}.pid").read_text())
                others += [pgid, *children(pgid)]
            pgid = int((self.run_dir(victim_host, name) / f"rank-{victim_rank}.pid").read_text())
            trainer = children(pgid)[0]
            killed_wall, t0 = time.time(), time.monotonic()
            os.kill(trainer, signal.SIGKILL)
            stopped = resumed = None
            deadline = t0 + 60
            while time.monotonic() < deadline and resumed is None:
                now = time.monotonic()
                if stopped is None and not any(alive(p) for p in others):
                    stopped = now - t0
                if stopped is not None and self.respawned(placement, name, killed_wall):
                    resumed = now - t0
                time.sleep(POLL)
            if stopped is None or resumed is None or not heard:
                raise RuntimeError(f"{mode} at {ranks} ranks: stopped {stopped}, resumed "
                                   f"{resumed}; see {self.work} (kept)")
            return heard[0] - t0, stopped, resumed
        finally:
            done.set()
            stop_job(load_record(name), self.connector)
            watchdog.join(timeout=60) if watchdog.is_alive() else None

    def respawned(self, placement: list[tuple[int, str]], name: str, after: float) -> bool:
        for rank, host in placement:
            try:
                if (self.run_dir(host, name) / f"rank-{rank}.pid").stat().st_mtime <= after:
                    return False
            except OSError:
                return False
        return True

    def wait_step(self, record: JobRecord, step: int, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = job_status(record, self.connector)
            if status.state != RUNNING:
                raise RuntimeError(f"{record.name}: {status.state} before step {step}")
            if (status.step or 0) >= step:
                return
            time.sleep(0.3)
        raise RuntimeError(f"{record.name}: no step {step} after {timeout:.0f} s")

    def cleanup(self) -> None:
        for name in self.jobs:
            try:
                stop_job(load_record(name), self.connector)
            except Exception as exc:  # noqa: BLE001 - clean up what can be
                print(f"stopping {name}: {exc}", file=sys.stderr)
        self.connector.close()
        for line in subprocess.run(["pgrep", "-f", "/runs/wd-"], capture_output=True,
                                   text=True).stdout.split():
            kill(int(line), signal.SIGKILL)
        self.box.down()

    def remove(self) -> None:
        """The work directory (job files, records), once the run succeeded."""
        shutil.rmtree(self.work, ignore_errors=True)


def _exit_on_sigterm(signum, frame):
    raise KeyboardInterrupt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--ranks", default="4,16", help="world sizes, multiples of --nodes")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--modes", default="push,poll")
    parser.add_argument("--after", type=int, default=4, help="kill after this step")
    opts = parser.parse_args()
    sizes = [int(x) for x in opts.ranks.split(",")]
    modes = opts.modes.split(",")
    if any(n % opts.nodes for n in sizes):
        parser.error(f"--ranks {opts.ranks}: each must be a multiple of --nodes {opts.nodes}")
    why = prerequisites()
    if why:
        raise SystemExit(f"cannot make a sandbox here: {why}")
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    bench = Bench(opts)
    results: dict[tuple[int, str], list[tuple[float, float, float]]] = {}
    started = time.monotonic()
    try:
        print(f"starting {opts.nodes} sandbox nodes ...", file=sys.stderr)
        bench.box.up(opts.nodes)
        print("warm-up (untimed): sync the code, fill the kernel cache ...", file=sys.stderr)
        bench.once(sizes[0], modes[0])
        for ranks in sizes:
            for i in range(opts.repeat):
                for mode in (modes if i % 2 == 0 else modes[::-1]):
                    took = bench.once(ranks, mode)
                    results.setdefault((ranks, mode), []).append(took)
                    print(f"  {ranks} ranks, {mode}, run {i + 1}: heard {took[0]:.2f} s, "
                          f"stopped {took[1]:.2f} s, resumed {took[2]:.2f} s", file=sys.stderr)
    finally:
        bench.cleanup()
    bench.remove()  # kept when a run failed (it says where)
    print(f"\nkill -9 of one rank, {opts.nodes} sandbox nodes, median of {opts.repeat} "
          f"({time.monotonic() - started:.0f} s in all)\n")
    print("| ranks | watchdog | restart decided | every other rank stopped | resume spawned "
          "| runs (stopped) |")
    print("|---|---|---|---|---|---|")
    for (ranks, mode), runs in sorted(results.items()):
        heard, stop, resume = (statistics.median(r[i] for r in runs) for i in range(3))
        every = ", ".join(f"{r[1]:.2f}" for r in runs)
        print(f"| {ranks} | {mode} | {heard:.2f} s | {stop:.2f} s | {resume:.2f} s | {every} |")


if __name__ == "__main__":
    main()
