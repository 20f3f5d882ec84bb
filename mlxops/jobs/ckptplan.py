"""Which checkpoint parts each node lacks before a resume, and where each comes from: a
pure plan (like pyinfra's operations: decided from what each node said it holds, before
anything is touched; :mod:`.ckptmove` carries it out).

A part is what one rank wrote that no other node has (:mod:`mlxops.node.protocol.parts`):
a pipeline stage's ``ckpt/stage-<s>/step-<n>/``, a ZeRO-1 rank's slice
``ckpt/step-<n>/zero-rank-<r>.safetensors``. The rule:

* **The step.** Of the steps every node of the run has a checkpoint of (pre-flight's
  candidates), the newest whose parts are all held somewhere: for each kind of part at
  that step, every index ``0..world-1`` on some node that answered (the run's nodes, or
  one the resume left out, ``--exclude``, when it still answers). Steps without parts (a
  data-parallel run) need nothing: the newest candidate.
* **Who needs what** is the kind's (:class:`PartsLayout`), one type per layout:
  a pipeline stage takes the layers it holds now by name from every stage's checkpoint of
  the step beside its own, so **a node needs each old stage whose layers meet its new
  ones** (and its own index's, the first's or the last's where it is first or last: see
  :class:`StageParts`); resumed on the same split, nothing. ZeRO-1 re-slices through
  ``all_gather`` from any rank that holds an old slice, so **each slice must be on one
  node of the run**: one no node of the run holds goes to its first node (rank 0's).
* **From where.** Each part from the first node that holds it, the run's nodes before the
  others (a node being left out may be slow or about to go); each is read once, however
  many nodes receive it.

A step with no complete set is refused with one line naming the step and the first part
no node that answered holds.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from mlxops.errors import MlxopsError
from mlxops.node.protocol import checkpoint_name
from mlxops.node.protocol.parts import STAGE, ZERO, CkptPart


class PlanError(MlxopsError):
    """No step whose parts are all held by a node that answered."""


class PartsLayout(Protocol):
    kind: str
    what: str  # a part in words: "stage 1's checkpoint"

    def destinations(self, part: CkptPart, holders: Sequence[str], run: Sequence[str]
                     ) -> list[str]:
        """The run's nodes that must receive ``part``, now held by ``holders``."""
        ...


@dataclass(frozen=True)
class StageParts:
    """Pipeline stages: the node of new stage ``i`` (layers ``[a, b)`` of ``split``) reads
    its own index's directory (the trainer finds its step there) and takes its layers by
    name from every stage's, so it needs old stage ``t`` when ``t == i``, when ``t``'s
    layers meet ``[a, b)``, when both are first (the embedding) or both last (the norm,
    the head). ``split`` None, or a part whose layers are not known: every node needs it."""

    split: tuple[int, ...] | None = None
    kind, what = STAGE, "stage {index}'s checkpoint"

    def needs(self, i: int, part: CkptPart) -> bool:
        if self.split is None or len(part.layers) != 2:
            return True
        a = sum(self.split[:i])
        b = a + self.split[i]
        first, end = part.layers
        last = len(self.split) - 1
        return (part.index == i or (first < b and a < end) or (i == 0 and part.index == 0)
                or (i == last and part.index == part.world - 1))

    def destinations(self, part: CkptPart, holders: Sequence[str], run: Sequence[str]
                     ) -> list[str]:
        return [h for i, h in enumerate(run) if h not in holders and self.needs(i, part)]


class ZeroSlices:
    """ZeRO-1: a slice on any node of the run is sent to every rank by ``all_gather``."""

    kind, what = ZERO, "the optimizer slice of rank {index}"

    def destinations(self, part: CkptPart, holders: Sequence[str], run: Sequence[str]
                     ) -> list[str]:
        return [] if any(h in holders for h in run) else list(run[:1])


def layouts(split: Sequence[int] | None = None) -> dict[str, PartsLayout]:
    """The layout of each kind of part; ``split``: the resumed run's layers per stage."""
    return {STAGE: StageParts(tuple(split) if split is not None else None),
            ZERO: ZeroSlices()}


@dataclass(frozen=True)
class Copy:
    """One part, read from ``source``, placed on each of ``dests``."""

    part: CkptPart
    source: str
    dests: tuple[str, ...]

    def line(self) -> str:
        return f"{self.part.path}: {self.source} -> {', '.join(self.dests)}"


@dataclass(frozen=True)
class MovePlan:
    step: int | None              # the step to resume from (None: no checkpoint)
    copies: tuple[Copy, ...] = ()

    def by_source(self) -> dict[str, list[Copy]]:
        out: dict[str, list[Copy]] = {}
        for c in self.copies:
            out.setdefault(c.source, []).append(c)
        return out

    def bytes(self) -> int:
        """What travels: each part once from its source, once to each of its nodes."""
        return sum(sum(c.part.files.values()) * (1 + len(c.dests)) for c in self.copies)


def plan(held: Mapping[str, Sequence[CkptPart]], run: Sequence[str],
         candidates: Collection[int], silent: Mapping[str, str] | None = None,
         split: Sequence[int] | None = None) -> MovePlan:
    """The step to resume from and the copies that give every node of ``run`` (in rank
    order) what it needs; ``held``: the parts each node that answered holds (the run's and
    any other); ``silent``: the nodes that did not answer, and why (named in a refusal);
    ``split``: a pipeline run's layers per stage, as it resumes."""
    order = [*run, *(h for h in held if h not in run)]
    first_missing = ""
    for step in sorted(set(candidates), reverse=True):
        at = [(h, p) for h in order for p in held.get(h, ()) if p.step == step]
        if not at:
            return MovePlan(step)
        copies, missing = _copies(at, run, layouts(split))
        if not missing:
            return MovePlan(step, tuple(copies))
        first_missing = first_missing or f"{checkpoint_name(step)}: {missing}"
    if not first_missing:
        return MovePlan(None)
    why = "; ".join(f"{h}: {w}" for h, w in (silent or {}).items())
    raise PlanError(f"no checkpoint to resume from has all its parts: {first_missing} is on "
                    "no node that answered" + (f" ({why})" if why else ""))


def _copies(at: list[tuple[str, CkptPart]], run: Sequence[str],
            kinds: Mapping[str, PartsLayout]) -> tuple[list[Copy], str]:
    """The copies for one step's parts, or the first part no node holds (in words)."""
    holders: dict[tuple[str, int, int], list[str]] = {}
    parts: dict[tuple[str, int, int], CkptPart] = {}
    for host, part in at:
        holders.setdefault(part.key, []).append(host)
        parts.setdefault(part.key, part)
    copies = []
    for kind in sorted({p.kind for p in parts.values()}):
        layout = kinds[kind]
        world = max(p.world for p in parts.values() if p.kind == kind)
        step = next(p.step for p in parts.values())
        for index in range(world):
            key = (kind, step, index)
            if key not in parts:
                return [], layout.what.format(index=index) + f" (of {world})"
            dests = layout.destinations(parts[key], holders[key], run)
            if dests:
                copies.append(Copy(parts[key], holders[key][0], tuple(dests)))
    return copies, ""
