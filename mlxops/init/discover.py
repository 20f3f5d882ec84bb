"""Macs offering SSH on the local network: Bonjour's ``_ssh._tcp`` over mDNS.

macOS advertises ``_ssh._tcp.local.`` while Remote Login is on (one instance per Mac,
named after its computer name). The browsing is python-zeroconf's (a maintained mDNS
implementation, not ours): :func:`discover` listens until the answers stop, resolves each
instance to its IPv4 address and port as soon as it is heard (from the cache its answer
filled, in a thread of its own), hands it on at once to a ``heard`` callback if given (so
that a host's work can start during the listening: ``mlxops init --all
--accept-new-host-keys``), and returns them all sorted by name. :class:`Browse` is the same
listening started at once and waited for later: ``mlxops init`` starts it before its own
imports, which then run while the first answers are on their way (each responder waits
20-120 ms before it answers, below).

When to stop: mDNS has no "that was everyone", so the listening ends ``quiet`` seconds
after the last new instance was heard, or ``seconds`` after the start at the latest (and
then, with nothing heard, empty). The browser's first query leaves 20-120 ms after it
starts, and a responder answers a query for a shared record (the ``_ssh._tcp`` PTR) after
20-120 ms of its own (RFC 6762, section 6): answers to one query spread over ~100 ms plus
the network's delay. A Mac on Wi-Fi whose radio dozes between beacons gets a multicast
query only at the next DTIM beacon, up to ~300 ms late (a DTIM period of 1-3 beacons of
102.4 ms), so its answer may come ~0.4 s after a wired Mac's. The default ``quiet`` of
0.5 s covers that after the last answer heard. A Mac whose answer (or whose copy of the
query) was lost answers the browser's next query, one second later (python-zeroconf's
startup queries follow each other after 1, 4 and 9 s), which a 0.5 s quiet interval does
not wait for: a longer ``quiet`` (``--browse-quiet``) does; a re-run of ``mlxops init`` adds
it too.
``interfaces``: the local addresses to browse on (default: every interface); a sandbox
test names its bridge's address so that only its own nodes answer.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

SERVICE = "_ssh._tcp.local."


@dataclass(frozen=True, order=True)
class Found:
    """One ``_ssh._tcp`` instance."""

    name: str      # the instance name: the Mac's computer name ("Studio-1")
    address: str   # its first IPv4 address
    port: int
    server: str    # its mDNS host name ("Studio-1.local.")


def listening_ends(start: float, seconds: float, quiet: float, last: float | None) -> float:
    """When the listening that began at ``start`` ends, ``last`` being when the last new
    instance was heard (None: none yet): ``quiet`` after it, ``seconds`` after ``start``
    at the latest."""
    bound = start + seconds
    return bound if last is None else min(bound, last + quiet)


class Browse:
    """One listening for ``_ssh._tcp``, started when made: python-zeroconf's engine and
    browser, in threads of their own (so the caller may go on with its own work, its
    imports, while the answers come: ``mlxops init`` makes one first thing). Each instance
    heard is resolved in a thread of its own and handed to the callback :meth:`hand_to`
    set, those resolved before it was set as it is set; :meth:`wait` ends the listening
    (``quiet`` after the last new name, ``seconds`` after the start at the latest) and
    returns them all, sorted; :meth:`close` ends the engine (after :meth:`wait`, or
    instead of it, on an error)."""

    def __init__(self, seconds: float = 3.0, interfaces: Sequence[str] | None = None,
                 quiet: float = 0.5) -> None:
        from zeroconf import InterfaceChoice, IPVersion, ServiceBrowser, Zeroconf

        self.seconds, self.quiet = seconds, quiet
        self._cond = threading.Condition()
        self._names: set[str] = set()
        self._last: float | None = None  # when the last new name came
        self._resolving: list = []
        self._heard: Callable[[Found], None] | None = None
        self._browser = None
        self._early: list[Found] = []  # resolved before a callback was set
        # Resolved off the browser's thread: a name whose records are not cached yet waits
        # for its own query there, and the next answers' handlers (which time the quiet)
        # must not.
        self._pool = ThreadPoolExecutor(4, thread_name_prefix="mlxops-mdns")
        self._zc = Zeroconf(interfaces=list(interfaces) if interfaces else InterfaceChoice.All,
                            ip_version=IPVersion.V4Only)
        try:
            self._start = time.monotonic()
            self._browser = ServiceBrowser(self._zc, SERVICE, handlers=[self._add])
        except BaseException:
            self.close()
            raise

    def hand_to(self, heard: Callable[[Found], None]) -> None:
        """Call ``heard`` with each instance once resolved: those resolved so far now (what
        it raises is raised here), the others from a resolving thread as they come (in no
        order to keep; what it raises then is raised by :meth:`wait`)."""
        with self._cond:
            self._heard, early, self._early = heard, self._early, []
        for found in early:
            heard(found)

    def _resolve(self, name: str) -> Found | None:
        info = self._zc.get_service_info(SERVICE, name, timeout=2000)
        if info is None or not info.parsed_addresses():
            return None
        found = Found(name[: -len(SERVICE) - 1], info.parsed_addresses()[0],
                      int(info.port or 22), info.server or "")
        with self._cond:
            heard = self._heard
            if heard is None:
                self._early.append(found)
        if heard is not None:
            heard(found)
        return found

    def _add(self, zeroconf, service_type, name, state_change) -> None:
        with self._cond:
            if name not in self._names:
                self._names.add(name)
                self._last = time.monotonic()
                self._resolving.append(self._pool.submit(self._resolve, name))
                self._cond.notify()

    def wait(self) -> list[Found]:
        """Every instance heard until ``quiet`` seconds passed without a new one
        (``seconds`` after the start at most), sorted; raises what a callback raised."""
        with self._cond:
            while True:
                now = time.monotonic()
                end = listening_ends(self._start, self.seconds, self.quiet, self._last)
                if now >= end:
                    break
                self._cond.wait(end - now)
        self._cancel()
        with self._cond:
            futures = list(self._resolving)
        return sorted(f for f in (future.result() for future in futures) if f is not None)

    def _cancel(self) -> None:
        with self._cond:
            browser, self._browser = self._browser, None
        if browser is not None:
            browser.cancel()

    def close(self) -> None:
        """End the listening (if :meth:`wait` did not) and the engine; safe to repeat."""
        self._cancel()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._zc.close()


def discover(seconds: float = 3.0, interfaces: Sequence[str] | None = None,
             quiet: float = 0.5, heard: Callable[[Found], None] | None = None) -> list[Found]:
    """Every ``_ssh._tcp`` instance heard until ``quiet`` seconds passed without a new one
    (``seconds`` at most: the module's docstring says why), sorted. ``heard``: called with
    each one once resolved, while the listening goes on, from a resolving thread (in the
    order the answers came, which is no order to keep); what it raises is raised here."""
    browse = Browse(seconds, interfaces, quiet)
    try:
        if heard is not None:
            browse.hand_to(heard)
        return browse.wait()
    finally:
        browse.close()
