"""What a job's ``notify:`` says (docs/job-file.md, "Notifications"), checked once.

The same section is the inventory's default (``mlxops_notify`` under ``all: vars``): a job
file's ``notify:`` is read over it key by key, and ``notify: false`` turns the default off
for one job. The command is words run on the controller without a shell (what the user
typed is never parsed by one); the webhook is an ``http``/``https`` URL that gets the event
as a JSON body.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit

from mlxops.events import (
    ALERT,
    FAILED,
    FINISHED,
    NOTIFIABLE,
    PLATEAU,
    RESTARTED,
    STALLED,
)

KEYS = ("command", "webhook", "events", "timeout", "retries")
#: By default, what needs a person: not the starts and stops they did themselves.
DEFAULT_EVENTS = (RESTARTED, STALLED, FAILED, FINISHED, ALERT, PLATEAU)
MAX_RETRIES = 20


class NotifyError(ValueError):
    """A bad ``notify:`` value; ``subkey`` is the key inside the section at fault."""

    def __init__(self, problem: str, subkey: str | None = None) -> None:
        super().__init__(problem)
        self.problem, self.subkey = problem, subkey


@dataclass(frozen=True)
class NotifyConfig:
    command: tuple[str, ...] = ()     # words; the event as JSON on its stdin
    webhook: str | None = None        # POSTed the event as JSON
    events: tuple[str, ...] = DEFAULT_EVENTS
    timeout: float = 10.0             # seconds one attempt may take
    retries: int = 5                  # attempts after the first, with back-off

    @property
    def targets(self) -> tuple[str, ...]:
        """``"command"``, ``"webhook"``: where each event goes (the ledger's keys)."""
        return (("command",) if self.command else ()) + (("webhook",) if self.webhook else ())

    def wants(self, kind: str) -> bool:
        return kind in self.events and bool(self.targets)

    def to_dict(self) -> dict[str, Any]:
        return {"command": list(self.command), "webhook": self.webhook,
                "events": list(self.events), "timeout": self.timeout, "retries": self.retries}


def _words(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        try:
            words = shlex.split(value)
        except ValueError as exc:
            raise NotifyError(f"cannot split into words: {exc}", "command") from None
    elif isinstance(value, list) and all(isinstance(w, (str, int, float)) for w in value):
        words = [str(w) for w in value]
    else:
        raise NotifyError("must be a list of words or one command line", "command")
    if not words:
        raise NotifyError("is empty", "command")
    return tuple(words)


def _url(value: Any) -> str:
    if not isinstance(value, str):
        raise NotifyError(f"must be an http:// or https:// URL, got {value!r}", "webhook")
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname or any(
            c.isspace() or ord(c) < 32 for c in value):
        raise NotifyError(f"must be an http:// or https:// URL, got {value!r}", "webhook")
    return value


def _events(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise NotifyError(f"must be a list of events ({', '.join(NOTIFIABLE)})", "events")
    for i, kind in enumerate(value):
        if kind not in NOTIFIABLE:
            raise NotifyError(f"unknown event {kind!r} (known: {', '.join(NOTIFIABLE)})",
                              f"events.{i}")
    return tuple(dict.fromkeys(value))


def _positive(value: Any, key: str, *, integer: bool = False, top: float) -> Any:
    ok = isinstance(value, int if integer else (int, float)) and not isinstance(value, bool)
    if not ok or value < (0 if integer else 1e-9) or value > top:
        kind = "whole number from 0" if integer else "number of seconds above 0"
        raise NotifyError(f"must be a {kind} to {top:g}, got {value!r}", key)
    return value


def check_section(data: Any) -> None:
    """Refuse a bad ``notify:`` before anything else happens (whether it names a target
    may depend on the inventory's default: :func:`effective` checks that)."""
    _overlay(data, NotifyConfig())


def effective(data: Any, default: NotifyConfig | None) -> NotifyConfig | None:
    """``notify:`` as written, read over ``default`` (the inventory's) key by key.

    None: nothing to notify (no section and no default, or ``false``).
    """
    if data is None:
        return default
    config = _overlay(data, default or NotifyConfig())
    if config is not None and not config.targets:
        raise NotifyError("says where to send nothing: give command: or webhook:")
    return config


def parse_default(data: Any) -> NotifyConfig | None:
    """The inventory's ``mlxops_notify``: a whole section (it names a target)."""
    return effective(data, None)


def _overlay(data: Any, base: NotifyConfig) -> NotifyConfig | None:
    if data is False:
        return None
    if not isinstance(data, Mapping):
        raise NotifyError("must be a mapping (command:, webhook:, events:, timeout:, "
                          "retries:) or false")
    for key in data:
        if key not in KEYS:
            raise NotifyError(f"unknown key (known: {', '.join(KEYS)})", str(key))
    config = base
    if "command" in data:
        config = replace(config, command=_words(data["command"]))
    if "webhook" in data:
        config = replace(config, webhook=_url(data["webhook"]))
    if "events" in data:
        config = replace(config, events=_events(data["events"]))
    if "timeout" in data:
        config = replace(config, timeout=float(_positive(data["timeout"], "timeout", top=300)))
    if "retries" in data:
        config = replace(config, retries=_positive(data["retries"], "retries", integer=True,
                                                   top=MAX_RETRIES))
    return config
