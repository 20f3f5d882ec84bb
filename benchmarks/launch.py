"""Benchmark: starting and stopping a job with mlxops against plain ``mlx.launch``.

On its own sandbox (N fake nodes; needs root), the bundled trainer with a tiny model:

1. launch to first step: from invoking the launcher until every rank has finished
   training step 1 (its ``progress/rank-<r>.json`` says step >= 1, read on the host side
   from the node homes, polled every 20 ms). ``mlx.launch --hostfile <render.launch_hostfile
   of the sandbox inventory> --backend ring --python <node python> -- -m mlxops.trainer
   --config FILE`` against ``mlxops launch JOB --detach`` (the CLI, so both sides pay
   for a Python start). The code is synced and the MLX kernel cache warmed by one untimed
   run of each first; so mlxops' figure is its pre-flight (reachability, versions, sync
   check, ports, leftovers) plus the detached start. Median of ``--repeat`` runs, each
   with a fresh run directory; every run is stopped completely before the next one.
2. stop at ``--stop-ranks`` ranks (nodes x mlxops_slots): a running job of that many
   ranks is stopped; mlxops' ``stop_job`` (SIGTERM, grace, SIGKILL, verify no rank runs
   and the ports are free; over fresh SSH connections) against what a user of mlx.launch
   does: Ctrl-C, i.e. SIGINT to mlx.launch's process group, timed until no rank process
   is left on any node.
3. the controller's CPU while a job trains (``--cpu-seconds``, after every rank ran step
   1): the launcher's process tree on the controller, both attached to the terminal as a
   user runs them: ``mlx.launch`` against ``mlxops launch JOB`` (its watchdog in the
   foreground). As a share of one core, from /proc; the ranks run on the nodes (under
   their sshd), so they are not counted. mlx.launch 0.32's I/O loop waits in ``select``
   on each rank's stdin pipe, which is always writable, so it never sleeps.

    sudo .venv/bin/python benchmarks/launch.py [--nodes 4] [--stop-ranks 16] [--repeat 3]
                                               [--cpu-seconds 10]

Every process it starts is stopped by pid and the sandbox taken down, also on Ctrl-C.

Longer than the project's modules on purpose: a benchmark is read and run as one script,
both sides of each comparison side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from mlxops import render
from mlxops.inventory import load_inventory
from mlxops.sandbox import Sandbox, netns, prerequisites

POLL = 0.02
MODEL = {"dims": 32, "layers": 1, "heads": 2, "vocab_size": 256, "seq_len": 32}


def trainer_config(global_batch: int = 8, micro_batch: int = 2) -> dict:
    # Enough steps to still be running when it is stopped; no checkpoints, little logging.
    return {"model": dict(MODEL), "data": {"source": "synthetic", "seed": 0},
            "train": {"steps": 1_000_000, "global_batch": global_batch,
                      "micro_batch": micro_batch, "lr": 3e-3, "checkpoint_every": 0,
                      "log_every": 1000}}


class Bench:
    """The sandbox, the work directory and everything started, for cleanup by pid."""

    def __init__(self, opts: argparse.Namespace):
        self.opts = opts
        self.work = Path(tempfile.mkdtemp(prefix="mlxops-bench-launch-", dir="/var/tmp"))
        self.work.chmod(0o755)  # the node user reads its home under it
        self.home = self.work / "controller"  # MLXOPS_HOME: job records
        os.environ["MLXOPS_HOME"] = str(self.home)
        pid = os.getpid()
        self.box = Sandbox(self.work / "sandbox", prefix=f"mxbl{pid % 100000}",
                           subnet=opts.subnet or free_subnet(pid))
        self.launchers: list[subprocess.Popen] = []   # mlx.launch / mlxops CLI processes
        self.jobs: list[str] = []                     # mlxops jobs launched
        self.patterns: list[str] = []                 # config paths of every rank started
        self.runs = 0
        self.cli_returned: list[float] = []  # mlxops launch --detach: seconds to exit
        self.node_home = ""  # the node user's home as the nodes see it
        self.env = {}

    # -- setup --------------------------------------------------------------------------

    def up(self) -> None:
        print(f"starting {self.opts.nodes} sandbox nodes ...", file=sys.stderr)
        self.box.up(self.opts.nodes)
        bindir = self.work / "bin"
        bindir.mkdir()
        ssh = shutil.which("ssh") or "/usr/bin/ssh"
        wrapper = bindir / "ssh"
        wrapper.write_text(
            "#!/bin/sh\n"
            f"exec {ssh} -F '{self.box.ssh_config_path}' -i '{self.box.key_path}' "
            f"-o IdentitiesOnly=yes -o UserKnownHostsFile='{self.box.known_hosts_path}' "
            "-o StrictHostKeyChecking=yes -o BatchMode=yes -o ConnectTimeout=5 \"$@\"\n")
        wrapper.chmod(0o755)
        self.env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}",
                    "MLXOPS_HOME": str(self.home)}
        first = self.box.nodes[0]
        out = subprocess.run(["ssh", f"{self.box.user}@{self.box.ip(first)}",
                              'printf %s "$HOME"'], env=self.env, capture_output=True,
                             text=True, timeout=30)
        if out.returncode != 0 or not out.stdout.startswith("/"):
            raise SystemExit(f"cannot reach {first} over ssh: {out.stderr.strip()}")
        self.node_home = out.stdout
        self.inventories = {1: self.box.inventory_path}

    def inventory(self, slots: int) -> Path:
        """The sandbox inventory, or a copy of it with ``mlxops_slots: slots``."""
        if slots not in self.inventories:
            doc = yaml.safe_load(self.box.inventory_path.read_text())
            doc["all"]["vars"]["mlxops_slots"] = slots
            path = self.work / f"inventory-{slots}.yml"
            path.write_text(yaml.safe_dump(doc, sort_keys=False))
            self.inventories[slots] = path
        return self.inventories[slots]

    def placement(self, slots: int) -> list[tuple[int, str]]:
        """(rank, node) in mlx.launch's and mlxops' order: slots consecutive ranks a node."""
        return [(i * slots + s, node) for i, node in enumerate(self.box.nodes)
                for s in range(slots)]

    def node_dirs(self, rel: str) -> None:
        """``~/rel`` on every node, owned by the node user (parents too)."""
        uid, gid = self.box.node_user_ids()
        for node in self.box.nodes:
            path = self.box.node_home(node)
            for part in Path(rel).parts:
                path = path / part
                path.mkdir(exist_ok=True)
                os.chown(path, uid, gid)

    # -- the two launchers ----------------------------------------------------------------

    def start_mlx_launch(self, slots: int, cfg: dict) -> tuple[subprocess.Popen, str, float]:
        self.runs += 1
        rel = f"bench-launch/run-{self.runs}"
        self.node_dirs(rel)
        remote = f"{self.node_home}/{rel}"
        text = json.dumps(dict(cfg, out=remote), indent=1)
        for node in self.box.nodes:
            self.box.write_node_file(node, f"{rel}/trainer.json", text)
        hosts = load_inventory(self.inventory(slots)).select("all")
        hostfile = self.work / f"hostfile-{self.runs}.json"
        hostfile.write_text(render.launch_hostfile(hosts, "ring"))
        port = 33000 + 50 * self.runs
        argv = [str(Path(sys.executable).with_name("mlx.launch")), "--hostfile", str(hostfile),
                "--backend", "ring", "--python", self.box.python, "--cwd", remote,
                "--starting-port", str(port),
                "--env", f"PYTHONPATH={self.node_home}/.mlxops/code",
                "--", "-m", "mlxops.trainer", "--config", f"{remote}/trainer.json"]
        self.patterns.append(f"{remote}/")
        log = open(self.work / f"mlx-launch-{self.runs}.log", "wb")
        t0 = time.monotonic()
        # Its own process group, as a shell job in a terminal; stdin an open pipe (a
        # terminal that never types), since mlx.launch forwards stdin to every rank.
        proc = subprocess.Popen(argv, env=self.env, stdin=subprocess.PIPE, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.launchers.append(proc)
        return proc, rel, t0

    def start_mlxops(self, slots: int, cfg: dict, detach: bool = True
                     ) -> tuple[subprocess.Popen, str, float]:
        self.runs += 1
        name = f"bl-{self.runs}"
        job = {"name": name, "inventory": str(self.inventory(slots)), "hosts": "all",
               "backend": "ring", "trainer": cfg, "stop_grace": 5.0}
        path = self.work / f"{name}.yml"
        path.write_text(yaml.safe_dump(job, sort_keys=False))
        self.jobs.append(name)
        self.patterns.append(f"/.mlxops/runs/{name}/")
        log = open(self.work / f"mlxops-{name}.log", "wb")
        t0 = time.monotonic()
        argv = [str(Path(sys.executable).with_name("mlxops")), "launch", str(path)]
        proc = subprocess.Popen(argv + (["--detach"] if detach else []), env=self.env,
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        log.close()
        self.launchers.append(proc)
        return proc, f".mlxops/runs/{name}", t0

    # -- watching -------------------------------------------------------------------------

    def wait_first_step(self, rel: str, slots: int, proc: subprocess.Popen,
                        timeout: float, detached: bool, t0: float = 0.0) -> float:
        """Monotonic time at which every rank's progress file first says step >= 1."""
        files = [self.box.node_home(node) / rel / "progress" / f"rank-{r}.json"
                 for r, node in self.placement(slots)]
        pending = list(files)
        self.launcher_exit = None  # seconds after t0 the launcher process exited, if it did
        deadline = time.monotonic() + timeout
        while True:
            now = time.monotonic()
            still = []
            for f in pending:
                try:
                    if json.loads(f.read_text()).get("step", 0) < 1:
                        still.append(f)
                except (OSError, ValueError):
                    still.append(f)
            pending = still
            if not pending:
                return now
            code = proc.poll()
            if code is not None and self.launcher_exit is None:
                self.launcher_exit = now - t0
            if code is not None and (code != 0 or not detached):
                raise RuntimeError(f"launcher exited ({code}) before every rank ran step 1; "
                                   f"see {self.work} (kept)")
            if now > deadline:
                raise RuntimeError(f"no step 1 after {timeout:.0f} s on "
                                   f"{len(pending)} rank(s); see {self.work} (kept)")
            time.sleep(POLL)

    def stop_mlx_launch(self, proc: subprocess.Popen, pattern: str, timeout: float = 20,
                        how: str = "ctrl-c") -> tuple[float, float, list[int]]:
        """``ctrl-c``: SIGINT to mlx.launch's process group (what a terminal sends);
        ``sigterm``: SIGTERM to the mlx.launch process alone (``kill PID``). Returns
        (seconds until no rank process is left, seconds until mlx.launch exited, pids
        still running at ``timeout``, which are then SIGKILLed); nan = never."""
        t0 = time.monotonic()
        try:
            if how == "ctrl-c":
                os.killpg(proc.pid, signal.SIGINT)
            else:
                os.kill(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        ranks_gone = launcher_gone = None
        deadline = t0 + timeout
        while time.monotonic() < deadline and (ranks_gone is None or launcher_gone is None):
            if ranks_gone is None and not rank_pids(pattern):
                ranks_gone = time.monotonic() - t0
            if launcher_gone is None and proc.poll() is not None:
                launcher_gone = time.monotonic() - t0
            time.sleep(POLL)
        leftover = rank_pids(pattern)
        for pid in leftover:
            kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            kill_group(proc.pid, signal.SIGKILL)
        proc.wait()
        if proc.stdin:
            proc.stdin.close()
        return (ranks_gone if ranks_gone is not None else float("nan"),
                launcher_gone if launcher_gone is not None else float("nan"), leftover)

    def stop_mlxops(self, name: str, grace: float | None = None) -> tuple[float, list[int]]:
        """``stop_job`` over fresh connections; (seconds, pids left behind afterwards)."""
        from mlxops.jobs.record import load_record
        from mlxops.jobs.stop import stop_job
        from mlxops.transport import Connector

        t0 = time.monotonic()
        with Connector() as connector:
            results = stop_job(load_record(name), connector, grace=grace)
            took = time.monotonic() - t0
        if results.exit_code:
            print(f"warning: stop_job({name}): "
                  f"{ {h: r.message for h, r in results.items() if not r.succeeded} }",
                  file=sys.stderr)
        leftover = rank_pids(f"/.mlxops/runs/{name}/")
        for pid in leftover:
            kill(pid, signal.SIGKILL)
        return took, leftover

    def wait_launcher(self, proc: subprocess.Popen, timeout: float = 60) -> None:
        """The detached mlxops CLI: it must have exited 0 (ranks are already running)."""
        code = proc.wait(timeout=timeout)
        if code != 0:
            raise RuntimeError(f"mlxops launch exited {code}; see {self.work} (kept)")

    # -- cleanup --------------------------------------------------------------------------

    def cleanup(self) -> None:
        for proc in self.launchers:
            if proc.poll() is None:
                kill_group(proc.pid, signal.SIGKILL)
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
        for name in self.jobs:
            try:
                if rank_pids(f"/.mlxops/runs/{name}/"):
                    self.stop_mlxops(name, grace=1.0)
            except Exception as exc:  # noqa: BLE001 - best effort, by pid below anyway
                print(f"cleanup: stop {name}: {exc}", file=sys.stderr)
        for pattern in self.patterns:
            for pid in rank_pids(pattern):
                kill(pid, signal.SIGKILL)
        try:
            self.box.down()
        finally:
            if not getattr(self, "keep", False):
                shutil.rmtree(self.work, ignore_errors=True)


# --- processes ---------------------------------------------------------------------------


def rank_pids(pattern: str) -> list[int]:
    """Trainer processes (all nodes share this PID namespace) whose --config contains
    ``pattern``. Only the ranks themselves: not the ssh clients or shells whose command
    line merely mentions the path."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        argv = [a.decode(errors="replace") for a in argv if a]
        if len(argv) >= 5 and argv[1:3] == ["-m", "mlxops.trainer"] and \
                any(pattern in a for a in argv[3:]):
            pids.append(int(entry))
    return pids


def kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def kill_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def free_subnet(pid: int) -> str:
    """A /24 in 10.245-249.x.0 that no address of this machine is in."""
    return netns.free_subnet(range(245, 250), pid)


# --- the measures ------------------------------------------------------------------------


def launch_once(bench: Bench, tool: str) -> float:
    """One launch to first step on every rank (1 rank a node); stopped fully after."""
    cfg = trainer_config()
    if tool == "mlx.launch":
        proc, rel, t0 = bench.start_mlx_launch(1, cfg)
        t1 = bench.wait_first_step(rel, 1, proc, timeout=120, detached=False)
        _, _, leftover = bench.stop_mlx_launch(proc, bench.patterns[-1])
    else:
        proc, rel, t0 = bench.start_mlxops(1, cfg)
        t1 = bench.wait_first_step(rel, 1, proc, timeout=120, detached=True, t0=t0)
        bench.wait_launcher(proc)
        if bench.launcher_exit is None:
            bench.launcher_exit = time.monotonic() - t0  # returned after the first step
        bench.cli_returned.append(bench.launcher_exit)
        _, leftover = bench.stop_mlxops(bench.jobs[-1])
    if leftover:
        print(f"warning: {tool}: {len(leftover)} rank(s) survived the stop (SIGKILLed)",
              file=sys.stderr)
    return t1 - t0


def stop_once(bench: Bench, tool: str, slots: int, how: str = "ctrl-c"
              ) -> tuple[float, float, str]:
    """Start nodes x slots ranks, then stop them once all ran step 1.

    Returns (seconds to first step on every rank, seconds to stop, note)."""
    world = len(bench.box.nodes) * slots
    cfg = trainer_config(global_batch=world, micro_batch=1)
    if tool == "mlx.launch":
        proc, rel, t0 = bench.start_mlx_launch(slots, cfg)
    else:
        proc, rel, t0 = bench.start_mlxops(slots, cfg)
    up = bench.wait_first_step(rel, slots, proc, timeout=150, detached=tool == "mlxops")
    if tool == "mlxops":
        bench.wait_launcher(proc)
    running = len(rank_pids(bench.patterns[-1]))
    if running != world:
        raise RuntimeError(f"{tool}: {running} rank processes found, want {world}")
    print(f"  {tool}: {world} ranks at step 1 after {up - t0:.1f} s; stopping "
          f"({how if tool == 'mlx.launch' else 'stop_job'})", file=sys.stderr)
    if tool == "mlx.launch":
        timeout = 20 if how == "ctrl-c" else 5
        took, launcher_gone, leftover = bench.stop_mlx_launch(
            proc, bench.patterns[-1], timeout=timeout, how=how)
        note = f"mlx.launch itself exited after {launcher_gone:.2f} s"
        if leftover:
            note += (f"; {len(leftover)} of {world} ranks still running {timeout} s later "
                     "(SIGKILLed by the benchmark)")
    else:
        took, leftover = bench.stop_mlxops(bench.jobs[-1])
        note = f"{len(leftover)} rank(s) survived (SIGKILLed by the benchmark)" \
            if leftover else ""
    return up - t0, took, note


def cpu_once(bench: Bench, tool: str, seconds: float) -> float:
    """Share of one core the launcher's process tree on the controller uses over
    ``seconds`` of training (1 rank a node, both attached); the job is stopped after."""
    cfg = trainer_config()
    cfg["train"]["steps"] = 1_000_000  # trains for as long as it is measured
    if tool == "mlx.launch":
        proc, rel, t0 = bench.start_mlx_launch(1, cfg)
    else:
        proc, rel, t0 = bench.start_mlxops(1, cfg, detach=False)
    bench.wait_first_step(rel, 1, proc, timeout=120, detached=False, t0=t0)
    cpu0, wall0 = tree_cpu_seconds(proc.pid), time.monotonic()
    time.sleep(seconds)
    share = (tree_cpu_seconds(proc.pid) - cpu0) / (time.monotonic() - wall0)
    if proc.poll() is not None:
        raise RuntimeError(f"{tool} exited during the CPU measure; see {bench.work} (kept)")
    if tool == "mlx.launch":
        bench.stop_mlx_launch(proc, bench.patterns[-1])
    else:
        bench.stop_mlxops(bench.jobs[-1])
        bench.wait_launcher(proc)  # the watchdog sees the stop and returns 0
    return share


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its descendants so far (/proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            # Fields after the command name's ")": state is field 3, utime 14, stime 15.
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError, IndexError):
            continue  # exited meanwhile
    return total / tick


def _exit_on_sigterm(signum, frame):
    # A plain SIGTERM would skip the finally: nodes, namespaces and ranks left behind.
    raise SystemExit(128 + signum)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--stop-ranks", type=int, default=16,
                        help="ranks of the stop measure (a multiple of --nodes)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-sigterm", dest="sigterm", action="store_false",
                        help="skip the extra run that stops mlx.launch with `kill PID` "
                             "(SIGTERM to mlx.launch alone) instead of Ctrl-C")
    parser.add_argument("--subnet", default=None, help="sandbox subnet (default: a free /24)")
    parser.add_argument("--cpu-seconds", type=float, default=10.0,
                        help="how long the controller's CPU is measured while a job trains "
                             "(0: not measured)")
    opts = parser.parse_args()
    if opts.stop_ranks % opts.nodes:
        parser.error(f"--stop-ranks {opts.stop_ranks} is not a multiple of --nodes {opts.nodes}")
    why = prerequisites()
    if why:
        raise SystemExit(f"cannot make a sandbox here: {why}")
    signal.signal(signal.SIGTERM, _exit_on_sigterm)

    bench = Bench(opts)
    started = time.monotonic()
    launch_times: dict[str, list[float]] = {"mlx.launch": [], "mlxops": []}
    stops: dict[str, tuple[float, float, str]] = {}
    cpu: dict[str, float] = {}
    slots = opts.stop_ranks // opts.nodes
    try:
        bench.up()
        print("warm-up (untimed): sync the code, fill the kernel cache ...", file=sys.stderr)
        for tool in ("mlxops", "mlx.launch"):  # mlxops first: its pre-flight syncs the code
            launch_once(bench, tool)
        bench.cli_returned.clear()
        for i in range(opts.repeat):
            for tool in (("mlx.launch", "mlxops") if i % 2 == 0 else ("mlxops", "mlx.launch")):
                took = launch_once(bench, tool)
                launch_times[tool].append(took)
                print(f"  run {i + 1}: {tool} first step after {took:.2f} s", file=sys.stderr)
        print(f"stop at {opts.stop_ranks} ranks ({opts.nodes} nodes x {slots}) ...",
              file=sys.stderr)
        for tool in ("mlx.launch", "mlxops"):
            stops[tool] = stop_once(bench, tool, slots)
        if opts.sigterm:
            stops["sigterm"] = stop_once(bench, "mlx.launch", slots, how="sigterm")
        if opts.cpu_seconds > 0:
            print(f"controller CPU over {opts.cpu_seconds:g} s of training ...", file=sys.stderr)
            for tool in ("mlx.launch", "mlxops"):
                cpu[tool] = cpu_once(bench, tool, opts.cpu_seconds)
    except BaseException:
        bench.keep = sys.exc_info()[0] is RuntimeError  # keep logs of a failed run
        raise
    finally:
        bench.cleanup()
    report(opts, launch_times, stops, bench.cli_returned, cpu, time.monotonic() - started)


def report(opts, launch_times, stops, cli_returned, cpu: dict[str, float],
           total: float) -> None:
    from rich.console import Console
    from rich.table import Table

    ml = statistics.median(launch_times["mlx.launch"])
    mo = statistics.median(launch_times["mlxops"])
    table = Table(title=f"launch and stop: {opts.nodes} sandbox nodes, launch 1 rank a node "
                        f"({opts.nodes} ranks), stop {opts.stop_ranks} ranks, "
                        f"{opts.repeat} repeats (median), {os.cpu_count()} cores")
    for col in ("measure", "mlx.launch", "mlxops", "ratio", "target", "ok?"):
        table.add_column(col, justify="left" if col == "measure" else "right")
    ratio = mo / ml
    cli = statistics.median(cli_returned)
    table.add_row("launch to first step, every rank (s)", f"{ml:.2f}", f"{mo:.2f}",
                  f"{ratio:.2f}x", "<= 1.1x", "yes" if ratio <= 1.1 else "NO")
    table.add_row("  runs (s)", " ".join(f"{t:.2f}" for t in launch_times["mlx.launch"]),
                  " ".join(f"{t:.2f}" for t in launch_times["mlxops"]), "", "", "")
    table.add_row("  (info) of which `mlxops launch --detach` ran (s)", "-", f"{cli:.2f}",
                  "", "", "")
    (ul, sl, sl_note), (uo, so, so_note) = stops["mlx.launch"], stops["mlxops"]
    n = opts.stop_ranks
    table.add_row(f"stop {n} running ranks (s)", f"{sl:.2f}", f"{so:.2f}",
                  f"{so / sl:.2f}x", "<= 2 s", "yes" if so <= 2.0 else "NO")
    table.add_row(f"  (info) launch to first step, {n} ranks, 1 run (s)", f"{ul:.1f}",
                  f"{uo:.1f}", f"{uo / ul:.2f}x", "-", "")
    if "sigterm" in stops:
        _, st, st_note = stops["sigterm"]
        shown = "never" if st != st else f"{st:.2f}"
        table.add_row(f"  (info) stop {n} ranks by `kill <mlx.launch pid>` (s)", shown, "-",
                      "", "-", "")
    if cpu:
        ratio = f"{cpu['mlxops'] / cpu['mlx.launch']:.2f}x" if cpu["mlx.launch"] else "-"
        table.add_row(f"controller CPU while training, attached (% of a core, "
                      f"{opts.cpu_seconds:g} s)", f"{100 * cpu['mlx.launch']:.0f}",
                      f"{100 * cpu['mlxops']:.0f}", ratio, "-", "")
    console = Console()
    if not console.is_terminal:
        console = Console(width=130)
    console.print(table)
    print("mlx.launch stop = Ctrl-C (SIGINT to its process group) until no rank process is "
          "left; mlxops stop = stop_job: SIGTERM, grace, SIGKILL, verify ranks gone and ports "
          "free, over fresh SSH connections.")
    for what, note in (("mlx.launch Ctrl-C", sl_note), ("mlxops stop_job", so_note),
                       ("kill <mlx.launch pid>", stops.get("sigterm", (0, 0, ""))[2])):
        if note:
            print(f"{what}: {note}")
    print(f"total {total:.0f} s")


if __name__ == "__main__":
    main()
