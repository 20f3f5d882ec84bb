"""Each host's work from the moment its mDNS answer is heard, when consent was given up
front (``mlxops init --all --accept-new-host-keys``: every host found is taken, every new
key recorded) -- or, with the hosts named (``mlxops init HOST... --accept-new-host-keys``),
from the start: each host's probe then waits for its own key, not for every key.

Policy. mDNS has no "that was everyone": the listening ends a quiet interval after the
last new answer (0.5 s by default: :mod:`mlxops.init.discover` gives the arithmetic).
With nothing left to ask the user, nothing in a host's own work waits for the others, so
it starts as soon as its answer is heard, during that interval, in a thread of its own:
drafted alone (:class:`~mlxops.init.drafts.Drafts`: bad input refused before it is
touched), its connection opened and its key judged from it by ``mlxops trust``'s rules
(:func:`mlxops.trust.judge_opened`: known; new, recorded as the connection opens;
changed, refused), then, if :func:`verdict` trusts it, its one probe command
(:func:`mlxops.init.probe.probe`). The file's own hosts (the new ones' peers) start with
the first answer: a run that hears nobody touches no host.

The time this saves: 16 sandbox nodes answer within ~0.1 s of the query, and the listening
goes on 0.5 s after the last answer; the keys then took ~0.33 s and the probes and the
files ~0.4 s after it (at load ~10), and now the keys and the probes start inside that
half-second: 0.10-0.38 s less from start to files on 16 nodes at load 7-10, the commit
before timed in the same rounds (benchmarks/README.md, "init.py").

What a host's probe cannot know yet is every peer: it tries the SSH addresses of the hosts
started before its probe starts (most, or all: a handshake takes longer than the answers'
spread), and the rest are tried by the second command :mod:`mlxops.init.flow` runs for a
host's untried peer addresses anyway (a Thunderbolt one), so the links found are the same.
With the hosts named, every address named is known before any connection opens: each
probe tries them all from the start (``peers``; an ssh_config alias once its connection
has resolved it), so no second command is needed for them. Against the barrier it
replaced (every key judged, the key blocks printed, then the probes), 0.81 -> 0.77 s on 16
named sandbox nodes at load 1-3, the commit before timed in the same rounds
(benchmarks/README.md, "init.py").
A host found that then does not answer SSH is such a peer too until its connection fails:
the probes started before that try its address (the closed port, then sshd's: a second
each where nothing comes back), which a batch of probes after every key would not.

Nothing here depends on the order the answers came in: :meth:`Pipeline.wait` returns the
hosts in the draft's order (the file's, then the new ones in the candidates' sorted order),
and a host's key and probe do not depend on the others'. A refused key is never recorded
(the connection refuses a changed key before any record), an unreachable host is reported
and left out, and no file but known_hosts is written before the flow's end.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from mlxops.errors import InternalError, UserError
from mlxops.init.drafts import Drafts
from mlxops.init.hosts import Candidate, is_address
from mlxops.transport.executor import MAX_FORKS, failure_result
from mlxops.transport.results import OK, HostResult, Results

TRUSTED, UNREACHABLE, CHANGED_KEY, REFUSED = "trusted", "unreachable", "changed", "refused"


def verdict(check, record: bool) -> str:
    """What init does with a host whose key check is ``check`` (None: no answer), new
    keys being recorded or not (``record``): probe it (trusted), or leave it out as
    unreachable, as having a changed key (its own or a jump host's), or as refused
    (blocked behind a jump host, or a new key not recorded)."""
    from mlxops.trust import BLOCKED, KEY_CHANGED, NEW

    if check is None:
        return UNREACHABLE
    if KEY_CHANGED in (check.state, *(j.state for j in check.jumps)):
        return CHANGED_KEY
    if check.state == BLOCKED or (check.state == NEW and not record):
        return REFUSED
    return TRUSTED


@dataclass
class Done:
    """Every host's work, in the draft's order."""

    fresh: dict[str, Candidate]  # the new hosts' draft names, in the candidates' order
    inventory: object            # the draft: the file's hosts, then the new ones
    keys: Results                # each host's key check (trust's results)
    probes: Results              # each trusted host's probe (value: a Probed)


def _guarded(name: str, work: Callable, *args) -> HostResult:
    """``work(*args)`` as a host's result: a host's failure is its result, a bug raises."""
    try:
        value = work(*args)
    except Exception as exc:  # noqa: BLE001 - sorted by failure_result: a host's, or a bug
        result = failure_result(name, exc)
        if result is None:
            raise
        return result
    return value if isinstance(value, HostResult) else HostResult(name, OK, value=value)


class Pipeline:
    """Starts each host's work as :meth:`heard` is told of it; :meth:`wait` ends it."""

    def __init__(self, make_drafts: Callable[[], Drafts], connector, pythons: Sequence[str],
                 judge: Callable | None = None, probe: Callable | None = None,
                 peers: Sequence[str] = ()) -> None:
        from mlxops.init.probe import probe as probe_host
        from mlxops.trust import judge_opened

        self.connector, self.pythons, self._make = connector, list(pythons), make_drafts
        self._judge, self._probe = judge or judge_opened, probe or probe_host
        self._pool = ThreadPoolExecutor(MAX_FORKS, thread_name_prefix="mlxops-init")
        self._lock = threading.Lock()
        self.drafts: Drafts | None = None
        self._queued: list[Candidate] = []  # heard before the draft was ready
        self._work: dict[str, Future] = {}
        self._ssh: dict[str, str] = {}  # host -> its SSH address as its connection has it
        self._named = frozenset(peers)  # addresses known before any connection opens
        self._error: UserError | None = None
        self._started = False  # the file's hosts: started with the first host heard

    def prepare(self) -> None:
        """Read the draft's file and vars (while the first answers are on their way:
        the browse has started), refusing bad input before any host is touched; then
        start the hosts heard so far."""
        drafts = self._make()
        drafts.base()  # the file's hosts with the command line's vars: exit 2 if bad
        with self._lock:
            self.drafts, queued, self._queued = drafts, self._queued, []
        for candidate in queued:
            self._start(candidate)

    def heard(self, candidate: Candidate) -> None:
        """Start ``candidate``'s work (and, with the first, the file's hosts'); one that
        is the file's, or was heard already, is left alone. Quick: from mDNS's thread."""
        with self._lock:
            if self.drafts is None:
                self._queued.append(candidate)
                return
        self._start(candidate)

    def _start(self, candidate: Candidate) -> None:
        with self._lock:
            if self._error is not None:
                return  # bad input met: nothing more is started
        name = self.drafts.add(candidate)
        with self._lock:
            old = [] if self._started else list(self.drafts.known)
            self._started = True
            for n in [*old, *([name] if name else [])]:
                self._work[n] = self._pool.submit(self._host, n)

    def _host(self, name: str) -> tuple[HostResult, HostResult | None] | None:
        """One host: drafted, opened and judged, then probed if trusted."""
        from mlxops.trust import record_new_keys

        try:
            host = self.drafts.host(name)
            host.check_local_files()
        except UserError as exc:
            with self._lock:
                self._error = self._error or exc
            return None
        keyed = _guarded(name, self._open, host)
        check = keyed.value
        if verdict(check, record=True) != TRUSTED:
            return keyed, None
        record_new_keys({name: check})  # a jump host's (a host's own went in as it opened)
        with self._lock:
            own = self._ssh[name]
            peers = sorted({a for a in (*self._ssh.values(), *self._named)
                            if is_address(a) and a != own})
        conn = self.connector.connect(host)
        return keyed, _guarded(name, self._probe, conn, host, self.pythons, peers)

    def _open(self, host) -> HostResult:
        """The host's SSH address noted (its peers' probes try it), its key judged."""
        conn = self.connector.connect(host)
        with self._lock:  # as the connection resolved it (an ssh_config alias's HostName)
            self._ssh[host.name] = getattr(conn, "address", host.address)
        return self._judge(host, self.connector)

    def wait(self, candidates: Sequence[Candidate]) -> Done:
        """After the listening: every one of ``candidates`` started (those not heard yet
        now), every host's work done; raises the first bad input met, or the bugs."""
        if self.drafts is None:
            self.prepare()
        for candidate in candidates:
            self.heard(candidate)
        with self._lock:
            work = dict(self._work)
        done, bugs = {}, {}
        for name, future in work.items():
            try:
                done[name] = future.result()
            except Exception as exc:  # noqa: BLE001 - a bug in a host's work: raised below
                bugs[name] = exc
        if bugs:
            raise InternalError(bugs)
        if self._error is not None:
            raise self._error
        at = {c: i for i, c in enumerate(candidates)}
        fresh = dict(sorted(self.drafts.fresh.items(),
                            key=lambda item: at.get(item[1], len(at))))
        inventory = self.drafts.load(fresh)
        order = [h.name for h in inventory.select(None)]
        return Done(fresh, inventory, Results({n: done[n][0] for n in order}),
                    Results({n: done[n][1] for n in order if done[n][1] is not None}))

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
