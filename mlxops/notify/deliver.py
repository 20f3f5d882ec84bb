"""Delivering a job's notifications: each event of its timeline at most once to each target.

The watchdog's caller runs a :class:`Notifier` beside the watchdog (``mlxops launch`` and
``mlxops watch`` while they supervise). The policy:

* **Never in the watchdog's way.** One thread per target (the command, the webhook) reads
  the timeline (:mod:`mlxops.events`) and delivers in order; the watchdog only appends
  events and never waits for a delivery. A hook that hangs holds up its own later
  notifications, nothing else.
* **At most once.** Before the first attempt the event is entered in the job's ledger
  (``notified.json`` beside the record) as ``sending``; a notifier that finds an entry
  never sends that event to that target again, even one a crashed process left at
  ``sending`` (it may or may not have arrived: sending it twice is what "at most once"
  rules out).
* **Retried with back-off.** A failed attempt (a non-2xx answer, a refused or timed-out
  connection, a command's non-zero exit) is tried again after 1, 2, 4, ... seconds (at most
  60) up to ``retries`` times, then given up: the ledger says ``failed``, the timeline gets
  a ``notify_failed`` event and the watchdog's log a line. A failing hook is never fatal.
* **Delivered is recorded.** Each success is a ``notified`` event on the timeline.

What a target gets (docs/formats.md, "Notifications"): the event as one JSON object (the
``events.jsonl`` line, plus ``text``, one line for chat webhooks). The command gets it on
stdin and as ``MLXOPS_EVENT_*`` environment variables.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mlxops import events
from mlxops.events import Event
from mlxops.filelock import exclusive
from mlxops.notify.config import NotifyConfig

LEDGER = "notified.json"
SENDING, SENT, GAVE_UP = "sending", "sent", "failed"
MAX_BACKOFF = 60.0
Log = Callable[[str], None]


@dataclass(frozen=True)
class Attempt:
    """One try at one target: delivered or not, and what the target said."""

    ok: bool
    detail: str       # "HTTP 204", "exit 0", "connection refused", ...


def payload(event: Event) -> dict[str, Any]:
    """What a target gets: the event, and ``text`` (one line, for chat webhooks)."""
    return {**event.to_dict(), "text": f"mlxops: {event.job}: {event.kind}: {event.message}"}


def post_webhook(url: str, event: Event, timeout: float) -> Attempt:
    body = json.dumps(payload(event)).encode()
    request = urllib.request.Request(url, data=body, method="POST", headers={
        "Content-Type": "application/json", "User-Agent": "mlxops-notify"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:  # noqa: S310 - checked scheme
            return Attempt(200 <= answer.status < 300, f"HTTP {answer.status}")
    except urllib.error.HTTPError as exc:
        return Attempt(False, f"HTTP {exc.code}")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return Attempt(False, str(reason) or type(exc).__name__)


def run_command(words: tuple[str, ...], event: Event, timeout: float) -> Attempt:
    env = {**os.environ, "MLXOPS_EVENT_JOB": event.job, "MLXOPS_EVENT_KIND": event.kind,
           "MLXOPS_EVENT_MESSAGE": event.message, "MLXOPS_EVENT_ID": event.id,
           "MLXOPS_EVENT_TIME": f"{event.time:.3f}"}
    try:
        done = subprocess.run(list(words), input=json.dumps(payload(event)).encode(), env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return Attempt(False, f"no answer within {timeout:g}s")
    except OSError as exc:
        return Attempt(False, f"{words[0]}: {exc.strerror or exc}")
    if done.returncode == 0:
        return Attempt(True, "exit 0")
    last = (done.stderr or b"").decode(errors="replace").strip().splitlines()[-1:]
    return Attempt(False, f"exit {done.returncode}" + (f": {last[0][:200]}" if last else ""))


class Ledger:
    """``{event id: {target: sending|sent|failed}}``, in the job's directory, shared by the
    notifier's threads (and any later notifier of the job)."""

    def __init__(self, job: str) -> None:
        self.path = events.path(job).with_name(LEDGER)
        self._lock = threading.Lock()

    def _load(self) -> dict[str, dict[str, str]]:
        try:
            data = json.loads(self.path.read_text())
        except (FileNotFoundError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def state(self, event_id: str, target: str) -> str | None:
        return self._load().get(event_id, {}).get(target)

    def claim(self, event_id: str, target: str) -> bool:
        """Mark the event ``sending`` to ``target``; False if it was ever entered before."""
        return self.set(event_id, target, SENDING, only_new=True)

    def set(self, event_id: str, target: str, state: str, *, only_new: bool = False) -> bool:
        with self._lock, exclusive(self.path.with_suffix(".lock")):
            data = self._load()
            entry = data.setdefault(event_id, {})
            if only_new and target in entry:
                return False
            entry[target] = state
            tmp = self.path.with_name(f".{LEDGER}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(data))
            os.replace(tmp, self.path)
            return True


class Notifier:
    """Delivers a job's notifications from a thread per target until :meth:`close`."""

    def __init__(self, job: str, config: NotifyConfig, *, log: Log = lambda _: None,
                 poll: float = 1.0, backoff: float = 1.0) -> None:
        self.job, self.config, self.log, self.poll = job, config, log, poll
        self.backoff = backoff   # the first retry's wait; each next one doubles
        self.ledger = Ledger(job)
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._abandon = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(t,), daemon=True,
                                          name=f"mlxops-notify-{t}") for t in config.targets]

    def start(self) -> Notifier:
        for thread in self._threads:
            thread.start()
        return self

    def nudge(self) -> None:
        """Look at the timeline now (an event was just appended)."""
        self._wake.set()

    def close(self, timeout: float = 15.0) -> None:
        """Deliver what is pending for up to ``timeout`` seconds, then stop. What is still
        in flight then stays ``sending`` in the ledger (never sent twice)."""
        self._closing.set()
        self._wake.set()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._abandon.set()

    def pending(self, target: str) -> list[Event]:
        return [e for e in events.read(self.job)
                if self.config.wants(e.kind) and self.ledger.state(e.id, target) is None]

    def _run(self, target: str) -> None:
        while True:
            delivered = False
            for event in self.pending(target):
                if self._abandon.is_set():
                    return
                if self.ledger.claim(event.id, target):
                    self._deliver(event, target)
                    delivered = True
            if delivered:
                continue  # more may have come while this one was on its way
            if self._closing.is_set():
                return
            self._wake.wait(self.poll)
            self._wake.clear()

    def _send(self, event: Event, target: str) -> Attempt:
        if target == "command":
            return run_command(self.config.command, event, self.config.timeout)
        return post_webhook(str(self.config.webhook), event, self.config.timeout)

    def _deliver(self, event: Event, target: str) -> None:
        attempts = 0
        while True:
            attempts += 1
            result = self._send(event, target)
            if result.ok:
                self.ledger.set(event.id, target, SENT)
                events.record(self.job, events.NOTIFIED,
                              f"{event.kind} sent to the {target} ({result.detail})",
                              attempt=event.attempt, event=event.id, event_kind=event.kind,
                              target=target, attempts=attempts)
                return
            if attempts > self.config.retries or self._abandon.is_set():
                break
            # Back off, but a closing notifier stops waiting once its time is up.
            if self._abandon.wait(min(MAX_BACKOFF, self.backoff * 2.0 ** (attempts - 1))):
                break
        self.ledger.set(event.id, target, GAVE_UP)
        message = (f"could not send {event.kind} to the {target} after {attempts} "
                   f"attempt(s): {result.detail}")
        events.record(self.job, events.NOTIFY_FAILED, message, attempt=event.attempt,
                      event=event.id, event_kind=event.kind, target=target,
                      attempts=attempts, error=result.detail)
        self.log(f"notify: {message}")
