"""Bring a run's checkpoint parts together before its ranks start: ask every node what it
holds, plan (:mod:`.ckptplan`), then carry out the copies.

Asked: the run's nodes (pre-flight resolved their root and interpreter) and the nodes of
the previous run that this one leaves out (``resume --exclude``; the record has their
root and interpreter), one ``parts`` command each, in parallel; a node left out that does
not answer is only named if its parts turn out to be needed.

Copied through the controller, the one path whose host keys mlxops verifies (the nodes do
not trust each other's): each part is read once from its source with the node's ``send``
as a stream (:mod:`.download`: never whole in memory) into a temporary directory here,
then streamed as a tar to each node that needs it (``receive``, which unpacks into a
temporary name and renames each part into place whole, :mod:`mlxops.node.ckptparts`).
The controller's temporary directory goes whatever happens. A copy that fails stops the
launch before any rank starts; parts placed before it stay (each is whole, and the next
resume's plan counts them).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mlxops import archive
from mlxops.errors import MlxopsError
from mlxops.jobs.ckptplan import Copy, MovePlan, plan
from mlxops.jobs.download import DownloadError, download, send_command
from mlxops.jobs.placement import NodePaths
from mlxops.node import protocol
from mlxops.node.protocol.parts import (
    RECEIVE,
    CkptPart,
    PartsAnswer,
    ReceiveAnswer,
    parts_args,
    receive_args,
)
from mlxops.node.protocol.send import send_args
from mlxops.transport import Connector, nodecmd, run_parallel

#: Seconds a node may take to list its parts (it reads headers, not weights).
LIST_TIMEOUT = 60.0


class MoveError(MlxopsError):
    """A part that could not be read from its node or placed on another."""


@dataclass(frozen=True)
class Node:
    """A node to ask: its inventory host, and where the job's run is on it."""

    host: object     # mlxops.inventory.Host
    root: str
    python: str

    @property
    def name(self) -> str:
        return self.host.name  # type: ignore[attr-defined]


def held_parts(nodes: Sequence[Node], job: str, connector: Connector, forks: int | None
               ) -> tuple[dict[str, list[CkptPart]], dict[str, str]]:
    """What each node holds, and the nodes that did not answer with why."""

    def work(node: Node) -> PartsAnswer:
        paths = NodePaths(node.root, job)
        answer = nodecmd.run_node(connector.connect(node.host), node.python, paths.code,
                                  parts_args(paths.run_dir), timeout=LIST_TIMEOUT)
        assert isinstance(answer, PartsAnswer), answer
        return answer

    results = run_parallel(list(nodes), work, forks=forks)
    held = {n: a.parts for n, a in results.succeeded_values().items()}
    silent = {n: (r.message or r.status) for n, r in results.items() if not r.succeeded}
    return held, silent


def bring_together(nodes: Sequence[Node], run: Sequence[str], job: str,
                   candidates: set[int] | None, connector: Connector, forks: int | None, *,
                   split: Sequence[int] | None = None) -> MovePlan:
    """Plan and carry out the copies that give every node of ``run`` (names, rank order)
    the parts of the step it resumes from; returns the plan (its ``step``: that step).
    ``nodes``: the run's and the others to ask; ``candidates``: the steps it may resume
    from (None: any step some node holds parts of); ``split``: a pipeline run's layers per
    stage as it resumes."""
    held, silent = held_parts(nodes, job, connector, forks)
    lost = [n for n in run if n in silent]
    if lost:
        raise MoveError(f"{lost[0]}: cannot list its checkpoint parts: {silent[lost[0]]}")
    if candidates is None:
        candidates = {p.step for parts in held.values() for p in parts}
    chosen = plan(held, run, candidates, silent, split)
    if chosen.copies:
        carry_out(chosen, {n.name: n for n in nodes}, job, connector)
    return chosen


def carry_out(chosen: MovePlan, nodes: dict[str, Node], job: str, connector: Connector
              ) -> None:
    """Each source's parts read once into a temporary directory here, then sent on."""
    tmp = Path(tempfile.mkdtemp(prefix=f"mlxops-{job}-parts-"))
    try:
        for source, copies in chosen.by_source().items():
            _read(nodes[source], copies, job, connector, tmp)
            for dest in sorted({d for c in copies for d in c.dests}):
                _place(nodes[dest], [c for c in copies if dest in c.dests], job,
                       connector, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _read(node: Node, copies: list[Copy], job: str, connector: Connector, into: Path) -> None:
    paths = NodePaths(node.root, job)
    files = [name for c in copies for name in c.part.files]
    ckpt = f"{paths.run_dir}/{protocol.CKPT_DIR}"
    command = send_command(node.python, paths.code, send_args(ckpt, files))
    try:
        got, result = download(connector.connect(node.host), command, into)
    except DownloadError as exc:
        raise MoveError(f"reading checkpoint parts: {exc}") from None
    if got.answer is None or got.answer.missing or not result.ok:
        why = got.answer.missing if got.answer and got.answer.missing else result.error_line()
        raise MoveError(f"{node.name}: cannot send its checkpoint parts: {why}")
    for c in copies:
        for name, size in c.part.files.items():
            if got.written.get(name) != size:
                raise MoveError(f"{node.name}: {name}: {got.written.get(name)} bytes came, "
                                f"{size} listed (changed while being read)")


def _place(node: Node, copies: list[Copy], job: str, connector: Connector, local: Path
           ) -> ReceiveAnswer:
    paths = NodePaths(node.root, job)
    files = {name: size for c in copies for name, size in c.part.files.items()}
    command = nodecmd.node_command(node.python, paths.code, receive_args(
        paths.run_dir, [c.part.path for c in copies], files))
    stream = archive.stream([archive.Entry(name, local / name) for name in files])
    try:
        result = connector.connect(node.host).run(command, stdin=stream, timeout=None)
        stream.check()
    except OSError as exc:
        raise MoveError(f"{node.name}: cannot receive checkpoint parts: {exc}") from None
    finally:
        stream.close()
    if not result.ok:
        raise MoveError(f"{node.name}: cannot receive checkpoint parts: "
                        f"{result.error_line()}")
    lines = result.stdout.strip().splitlines()
    try:
        answer = protocol.parse_answer(RECEIVE, lines[-1] if lines else "")
    except protocol.ProtocolError as exc:
        raise MoveError(f"{node.name}: receive: unreadable answer ({exc})") from None
    assert isinstance(answer, ReceiveAnswer), answer
    return answer
