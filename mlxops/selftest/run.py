"""One ``mlxops selftest``: what the test suite runs on the sandbox, run on the user's own
nodes, through the same library calls the commands make.

The steps (:data:`mlxops.selftest.summary.STEPS`), in order:

1. **trust**: each host's key against known_hosts (known, new, changed), recording
   nothing. An unknown key fails the step unless ``--accept-new-host-keys`` (the next
   connection then records it, as everywhere); a changed key always fails it.
2. **provision**: the bundled playbook, as ``mlxops provision`` runs it (facts cached).
3. **check**: the readiness checks, as ``mlxops check`` runs them (no ``--job``).
4. **bench**: a short one: 4 streams for 0.5 s per direction of every pair, the ring
   search, and an all-reduce of 4 KiB, 256 KiB and 4 MiB (:data:`BENCH_SIZES`).
5. **job**: the bundled trainer on every host, one rank killed with ``kill -9`` over SSH
   mid-run and recovered by the watchdog (:mod:`mlxops.selftest.job`).
6. **stop**: the job stopped (verified: nothing of it runs, its ports are free), its run
   directories and its controller record removed (kept, stopped, with ``--keep``).

Policy: everything the user gave (inventory, ``--limit``, ``--skip``, the job the hosts
make) is checked before any connection (exit 2). A step that fails (or cannot reach a host)
ends the run: the steps after it are *not run*, since each needs the one before (keys for
every connection, a provisioned node for the checks, ready nodes for a job). The one
exception is **stop**: whenever the job step ran, whatever became of it, and on Ctrl-C,
the stop step runs, so nothing is left running. ``--skip`` leaves steps out (``job``
takes its stop with it); facts are still read for the summary when provision is skipped.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from importlib import metadata
from pathlib import Path

from mlxops import __version__
from mlxops.bench.choices import ALL, default_port
from mlxops.bench.measure import Settings
from mlxops.bench.run import Request, run_bench
from mlxops.errors import EXIT_OK, EXIT_UNREACHABLE, MlxopsError, bad_input
from mlxops.hostfacts import HostFacts
from mlxops.inventory import load_inventory
from mlxops.inventory.backend import hosts_backend
from mlxops.jobs.spec import JobSpec
from mlxops.node.protocol import LAUNCHER
from mlxops.paths import playbooks_dir
from mlxops.playbook import load_playbook, run_play
from mlxops.selftest import job as selftest_job
from mlxops.selftest import summary as S
from mlxops.selftest.choices import DEFAULT_TIMEOUT, SKIPPABLE
from mlxops.selftest.summary import HostInfo, Step, Summary
from mlxops.tasks import facts as node_facts
from mlxops.tasks.facts import save_facts
from mlxops.transport import ConnectOptions, Connector, GroupError, run_parallel
from mlxops.trust import BLOCKED, KEY_CHANGED, KNOWN, LOCAL, NEW, check_host_keys

OnEvent = Callable[[str], None]
#: A few seconds of links: one 4-stream run per direction of a pair, as iperf3 -P 4 would.
BENCH_SETTINGS = Settings(streams=(4,), seconds=0.5, omit=0.25)
#: A small all-reduce: latency (4 KiB) up to bandwidth (4 MiB; busbw averages >= 1 MiB).
BENCH_SIZES = (4 << 10, 256 << 10, 4 << 20)


@dataclass(frozen=True)
class Options:
    inventory: Path
    limit: str | None = None
    skip: frozenset[str] = frozenset()
    keep: bool = False
    timeout: float = DEFAULT_TIMEOUT     # the job step: launch to recovered
    connect: ConnectOptions = field(default_factory=ConnectOptions)
    forks: int | None = None


def parse_skip(text: str | None) -> frozenset[str]:
    """``--skip bench,check`` -> the steps to leave out; an unknown one is bad input."""
    words = {w.strip() for w in (text or "").split(",") if w.strip()}
    unknown = sorted(words - set(SKIPPABLE))
    if unknown:
        raise bad_input("--skip", None, f"{unknown[0]!r}: the steps that can be skipped are "
                                        f"{', '.join(SKIPPABLE)}")
    return frozenset(words)


def controller_info() -> dict[str, str | None]:
    try:
        mlx = metadata.version("mlx")
    except metadata.PackageNotFoundError:
        mlx = None
    return {"mlxops": __version__, "system": f"{platform.system()} {platform.machine()}",
            "python": platform.python_version(), "mlx": mlx}


def run_selftest(options: Options, on_event: OnEvent = lambda _: None) -> Summary:
    """Every step, the summary of them all. Bad input raises before any connection; a bug
    raises too, after the job (if any) was stopped and removed."""
    return _Selftest(options, on_event).run()


class _Selftest:
    def __init__(self, options: Options, on_event: OnEvent):
        # Everything given is checked here, before any connection.
        self.options, self.on_event = options, on_event
        self.inventory = load_inventory(options.inventory)
        self.hosts = self.inventory.select(options.limit, source="--limit")
        self.play = load_playbook(playbooks_dir() / "provision.yml")
        backend = hosts_backend(self.hosts, self.inventory.path)
        self.bench = Request(inventory=self.inventory.path, limit=options.limit, pairs=ALL,
                             settings=replace(BENCH_SETTINGS, port=default_port()),
                             sizes=BENCH_SIZES)
        self.spec: JobSpec | None = None
        if S.JOB not in options.skip:
            self.spec = selftest_job.job_spec(self.inventory.path, options.limit or "all",
                                              backend, sum(h.slots for h in self.hosts))
        self.target = None
        if S.CHECK not in options.skip:
            from mlxops.checks.target import load_target  # pytest loads only for checks

            self.target = load_target(self.inventory.path, limit=options.limit,
                                      options=options.connect, forks=options.forks)
        self.summary = Summary(str(self.inventory.path), [h.name for h in self.hosts],
                               options.limit, controller_info(), kept=options.keep)
        self.facts: dict[str, HostFacts] = {}

    def run(self) -> Summary:
        start = time.monotonic()
        steps = {S.TRUST: self._trust, S.PROVISION: self._provision, S.CHECK: self._check,
                 S.BENCH: self._bench, S.JOB: self._job}
        blocked = ""
        with Connector(self.options.connect) as self.connector:
            try:
                for step in self.summary.steps[:-1]:
                    if step.name in self.options.skip:
                        step.result = S.SKIPPED
                    elif blocked:
                        step.detail = blocked
                    else:
                        self._timed(step, steps[step.name])
                        if step.result in (S.INTERRUPTED, S.FAILED, S.UNREACHABLE):
                            blocked = f"after {step.name}: {step.result}"
                    if step.name == S.PROVISION and step.result == S.SKIPPED and not blocked:
                        self._read_facts()  # provision's own facts are the summary's
            except KeyboardInterrupt:  # between steps (the facts): the steps say the rest
                self.summary.interrupted = True
            finally:
                self._finish(blocked or ("interrupted" if self.summary.interrupted else ""))
                self.summary.duration = time.monotonic() - start
        return self.summary

    def _finish(self, blocked: str) -> None:
        """The stop step whenever the job step ran (on a failure, a bug or Ctrl-C too),
        and the hosts as their facts describe them."""
        stop = self.summary.step(S.STOP)
        if self.summary.step(S.JOB).ran:
            self._timed(stop, self._stop)
        elif S.JOB in self.options.skip:
            stop.result = S.SKIPPED
        else:
            stop.detail = blocked
        self.summary.host_info = [HostInfo.from_facts(h.name, self.facts.get(h.name))
                                  for h in self.hosts]

    def _timed(self, step: Step, work: Callable[[Step], None]) -> None:
        self.on_event(f"{step.name} ...")
        t0 = time.monotonic()
        # Failed until the step says otherwise: a bug raised through here still counts the
        # step as run (the job's stop then runs on the way out).
        step.result = S.FAILED
        try:
            work(step)
        except KeyboardInterrupt:
            step.result = S.INTERRUPTED
            step.problems.append("Ctrl-C")
            self.summary.interrupted = True
        except GroupError as exc:
            step.result = S.UNREACHABLE if exc.results.unreachable else S.FAILED
            step.problems += [f"{h}: {exc.results[h].message or exc.results[h].status}"
                              for h in exc.results.unreachable + exc.results.failed]
        except MlxopsError as exc:
            step.result = S.FAILED
            step.problems.append(str(exc))
        finally:
            step.seconds = time.monotonic() - t0
        self.on_event(f"{step.name}: {step.result} ({step.seconds:.1f} s)")

    # --- the steps ---------------------------------------------------------------------------

    def _trust(self, step: Step) -> None:
        results, checks = check_host_keys(self.hosts, self.connector, forks=self.options.forks)
        accept = self.options.connect.accept_new_host_keys
        states: dict[str, str] = {}
        for host, result in results.items():
            check = checks.get(host)
            state = check.state if check is not None else S.UNREACHABLE
            states[host] = state
            step.data[host] = {"state": state, "key": check.key_type if check else None,
                               "fingerprint": check.fingerprint if check else None}
            if check is None:
                step.problems.append(f"{host}: unreachable: {result.message}")
            elif state == KEY_CHANGED:
                step.problems.append(f"{host}: host key CHANGED, now {check.key_type} "
                                     f"{check.fingerprint}: find out why before trusting it")
            elif state == NEW and not accept:
                step.problems.append(f"{host}: unknown host key {check.key_type} "
                                     f"{check.fingerprint}: compare it with the Mac's, then "
                                     f"mlxops trust {self.options.inventory}")
            elif state == BLOCKED:
                step.problems.append(f"{host}: behind a jump host whose key is not recorded "
                                     f"(or changed): mlxops trust {self.options.inventory}")
        step.result = (S.UNREACHABLE if results.unreachable else
                       S.FAILED if step.problems else S.OK)
        order = (KNOWN, NEW, KEY_CHANGED, BLOCKED, LOCAL, S.UNREACHABLE)
        step.detail = ", ".join(f"{n} {s}" for s in order
                                if (n := sum(v == s for v in states.values())))
        if accept and NEW in states.values():
            step.detail += " (new keys recorded on first connection: --accept-new-host-keys)"

    def _provision(self, step: Step) -> None:
        result = run_play(self.play, self.hosts, self.inventory, self.connector,
                          forks=self.options.forks)
        for name, facts in result.facts.items():
            if facts:
                save_facts(name, facts)
                self.facts[name] = facts
        totals = {k: sum(c[k] for c in result.counts.values())
                  for k in ("ok", "changed", "failed", "skipped")}
        step.data = {"counts": result.counts}
        step.detail = ", ".join(f"{n} {k}" for k, n in totals.items() if n) + " tasks"
        step.problems += [f"{h}: unreachable: {why}" for h, why in result.unreachable.items()]
        step.problems += [f"{h}: {why}" for h, why in result.failed.items()]
        step.result = {EXIT_OK: S.OK, EXIT_UNREACHABLE: S.UNREACHABLE}.get(result.exit_code,
                                                                           S.FAILED)

    def _read_facts(self) -> None:
        """Facts for the summary when provision did not run (read-only, one command a
        host; a host that does not answer is shown without them)."""
        got = run_parallel(self.hosts,
                           lambda h: node_facts.ask_facts(self.connector.connect(h), h),
                           forks=self.options.forks)
        self.facts.update(got.succeeded_values())

    def _check(self, step: Step) -> None:
        from mlxops.checks.outcome import ERROR, FAILED, UNREACHABLE
        from mlxops.checks.report import counts
        from mlxops.checks.run import run_checks

        report = run_checks(self.target)
        tally = counts(report)
        step.data = {"counts": tally, "checks": list(report.checks)}
        step.detail = (f"{S.count(len(report.checks), 'check')} x "
                       f"{S.count(len(report.hosts), 'host')}: "
                       + ", ".join(f"{n} {o}" for o, n in tally.items() if n))
        unreachable = set()
        for r in report.results:
            if r.outcome == UNREACHABLE and r.host not in unreachable:
                unreachable.add(r.host)  # every check of it says so: once is enough
                step.problems.append(f"{r.host}: unreachable: {r.message}")
            elif r.outcome in (FAILED, ERROR):
                text = r.message
                if r.host and not text.startswith(f"{r.host}:"):
                    text = f"{r.host}: {text}"
                step.problems.append(f"{text} ({r.check})")
        step.result = {EXIT_OK: S.OK, EXIT_UNREACHABLE: S.UNREACHABLE}.get(report.exit_code,
                                                                           S.FAILED)

    def _bench(self, step: Step) -> None:
        result = run_bench(self.bench, self.connector,
                           lambda m: self.on_event(f"bench: {m}"))
        self.summary.links = S.links_from(result)
        self.summary.ring = S.ring_from(result)
        self.summary.allreduce = S.allreduce_from(result)
        speeds = [g for x in self.summary.links for g in (x.a_to_b_gbps, x.b_to_a_gbps)
                  if g is not None]
        busbw = (self.summary.allreduce or {}).get("busbw_gbps")
        step.detail = (f"{S.count(len(self.summary.links), 'link')}"
                       + (f", {min(speeds):.3g}-{max(speeds):.3g} Gbit/s" if speeds else "")
                       + (f"; all-reduce busbw {busbw:.3g} Gbit/s" if busbw else ""))
        step.data = {"seconds": {k: round(v, 3) for k, v in result.seconds.items()}}
        step.problems += [f"{h}: unreachable: {why}" for h, why in result.unreachable.items()]
        step.problems += list(result.failures)
        step.result = (S.UNREACHABLE if result.unreachable else
                       S.FAILED if result.failures else S.OK)

    def _job(self, step: Step) -> None:
        assert self.spec is not None, "the job step runs only when not skipped"
        hosts = {h.name: h for h in self.hosts}
        record, recovery = selftest_job.run_job(
            self.spec, self.connector, hosts, self.options.timeout,
            lambda m: self.on_event(m))
        self.summary.recovery = recovery
        step.data = {"name": selftest_job.NAME, "ranks": record.world_size,
                     "backend": record.backend}
        step.detail = (f"{record.world_size} ranks ({record.backend}), rank {recovery.rank} "
                       f"on {recovery.host} killed, recovered in "
                       f"{recovery.recovered_seconds:.1f} s")
        step.result = S.OK

    def _stop(self, step: Step) -> None:
        record = selftest_job.own_record()
        keep = self.options.keep
        if record is None:
            results = selftest_job.remove_unrecorded(self.hosts, self.connector,
                                                     self.options.forks)
            step.detail = "nothing was started; run directories removed"
        else:
            results = selftest_job.stop_and_remove(record, self.connector, keep=keep,
                                                   forks=self.options.forks)
            signalled = [k for r in results.values() for k in r.data.get("signalled", [])]
            ranks = sum(k != LAUNCHER for k in signalled)
            step.detail = (f"{S.count(ranks, 'rank')}"
                           + (" and mpirun" if LAUNCHER in signalled else "")
                           + f" stopped, nothing of {selftest_job.NAME} runs"
                           + (f"; kept for mlxops logs/report {selftest_job.NAME}" if keep
                              else "; run directories and record removed"))
        step.problems += [f"{h}: {results[h].message or results[h].status}"
                          for h in results.unreachable + results.failed]
        step.result = (S.UNREACHABLE if results.unreachable else
                       S.FAILED if results.failed else S.OK)
