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
    NEEDS_REBOOT,
    NOTIFIABLE,
    PLATEAU,
    RESTARTED,
    STALLED,
)

KEYS = ("command", "webhook", "events", "timeout", "retries")
#: By default, what needs a person: not the starts and stops they did themselves.
DEFAULT_EVENTS = (RESTARTED, STALLED, NEEDS_REBOOT, FAILED, FINISHED, ALERT, PLATEAU)
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


@dataclass(frozen=True)
class NotifySection:
    """A ``notify:`` as written, parsed once: the keys it sets (None: not set, the
    default's value stands), or ``off`` (``notify: false``). Read over the inventory's
    default by :func:`resolve` once the job's hosts are known."""

    off: bool = False
    command: tuple[str, ...] | None = None
    webhook: str | None = None
    events: tuple[str, ...] | None = None
    timeout: float | None = None
    retries: int | None = None

    def set_keys(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in KEYS if getattr(self, key) is not None}

    def to_dict(self) -> dict[str, Any] | bool:
        """As the job file would write it (the record's copy): ``false``, or the keys set."""
        if self.off:
            return False
        return {key: list(v) if isinstance(v, tuple) else v
                for key, v in self.set_keys().items()}


def parse_section(data: Any) -> NotifySection | None:
    """A ``notify:`` section (or the record's copy of one), every key checked; None when
    there is none. :class:`NotifyError` names the key at fault."""
    if data is None:
        return None
    if data is False:
        return NotifySection(off=True)
    if not isinstance(data, Mapping):
        raise NotifyError("must be a mapping (command:, webhook:, events:, timeout:, "
                          "retries:) or false")
    for key in data:
        if key not in KEYS:
            raise NotifyError(f"unknown key (known: {', '.join(KEYS)})", str(key))
    values: dict[str, Any] = {}
    if "command" in data:
        values["command"] = _words(data["command"])
    if "webhook" in data:
        values["webhook"] = _url(data["webhook"])
    if "events" in data:
        values["events"] = _events(data["events"])
    if "timeout" in data:
        values["timeout"] = float(_positive(data["timeout"], "timeout", top=300))
    if "retries" in data:
        values["retries"] = _positive(data["retries"], "retries", integer=True,
                                      top=MAX_RETRIES)
    return NotifySection(**values)


def resolve(section: NotifySection | None, default: NotifyConfig | None
            ) -> NotifyConfig | None:
    """``section`` read over ``default`` (the inventory's) key by key.

    None: nothing to notify (no section and no default, or ``false``).
    """
    if section is None:
        return default
    if section.off:
        return None
    config = replace(default or NotifyConfig(), **section.set_keys())
    if not config.targets:
        raise NotifyError("says where to send nothing: give command: or webhook:")
    return config


def effective(data: Any, default: NotifyConfig | None) -> NotifyConfig | None:
    """``notify:`` as written, parsed and read over ``default``."""
    return resolve(parse_section(data), default)


def parse_default(data: Any) -> NotifyConfig | None:
    """The inventory's ``mlxops_notify``: a whole section (it names a target)."""
    return effective(data, None)
