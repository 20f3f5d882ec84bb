"""The watch channel: one long-lived ``python -m mlxops.node watch`` per host of a job, whose
stdout is a stream of :class:`ChannelMessage` lines (docs/node-protocol.md, "watch").

The helper looks at the job's run directory every ``TICK`` seconds, on the node (a few
``stat`` calls and a signal 0 per rank: no process table, no subprocess). It sends the
host's whole ``status`` answer at once when a rank's process or files changed (it started,
exited, vanished: ``changed`` names it), and at least every ``BEAT`` seconds otherwise
(``changed`` empty: a beat, with the heartbeats the trainer wrote since). So a death reaches
the controller one tick and one network trip after it happened, and a silent channel is
one whose host stopped answering, not one with nothing to say. The helper ends when its
stdin ends (the controller closed the channel, or went away with its SSH session).

The other way, the controller may write :class:`ChannelRequest` lines to the helper's
stdin: ``stop`` makes the helper stop every rank at once, as the ``stop`` command would,
without the SSH session and the Python start-up a new command costs (on a node whose
cores the ranks keep busy, most of a second). The watchdog sends it when it has decided to
stop the job, then runs the ``stop`` command anyway, which verifies.

The command, its flags and its timing (``TICK``, ``BEAT``, ``LOST_AFTER``: the controller
gives up on a channel that said nothing that long) are :mod:`.commands`'; each line is a
:class:`ChannelMessage`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from mlxops.node.protocol.answers import StatusAnswer
from mlxops.node.protocol.commands import WATCH
from mlxops.node.protocol.decode import ProtocolError, Record, decode


@dataclass
class ChannelMessage(Record):
    """One line of the watch channel."""

    seq: int                             # 0, 1, 2, ... on this channel
    changed: list[int | str]             # ranks (or LAUNCHER) whose process or files changed
    status: StatusAnswer                 # the host's whole status answer, now

    def to_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "changed": list(self.changed), "status": self.status.to_dict()}

    def line(self) -> str:
        """The message as the channel's line (with its newline)."""
        return json.dumps(self.to_dict()) + "\n"


@dataclass
class ChannelRequest(Record):
    """One line the controller writes to the helper's stdin."""

    stop: float | None = None            # stop every rank now, SIGKILL after this grace

    def line(self) -> str:
        return json.dumps(self.to_dict())


def parse_request(line: str) -> ChannelRequest:
    """The helper's reading of one stdin line; ProtocolError if unreadable."""
    try:
        return decode(ChannelRequest, json.loads(line))
    except ValueError as exc:  # not JSON, or a ProtocolError
        raise ProtocolError(f"{WATCH} request: {exc}") from None


def parse_message(line: str) -> ChannelMessage:
    """The controller's reading of one channel line; ProtocolError if unreadable."""
    try:
        doc = json.loads(line)
    except ValueError as exc:
        raise ProtocolError(f"{WATCH}: not JSON: {line[-200:]!r}") from exc
    try:
        return decode(ChannelMessage, doc)
    except ProtocolError as exc:
        raise ProtocolError(f"{WATCH}: {exc}") from None
