"""ZeRO-1's checkpoints: each rank's slice of the optimizer state, with its offsets, and
the re-slicing that lets a run resume on another number of ranks (:mod:`.zero` holds the
layout and the step).

Each rank writes ``zero-rank-<r>.safetensors`` (:func:`save_slice`; the offsets
``zero_rank``, ``zero_world``, ``zero_lo``, ``zero_hi``, ``zero_total`` in the file's
safetensors metadata) into a staging directory beside the checkpoint (:func:`stage_slice`),
and its node's writer moves its node's slices into the checkpoint as it writes it
(:func:`place_staged`), so that they appear with it or not at all. A resume on as many ranks
reads each rank's own slice; on another number it re-slices (:func:`load_slices`): the
ranks agree (``all_gather``) who holds each old slice, the holder sends it and every rank
keeps what falls in its new range. An old slice no rank holds is refused.

stdlib + mlx + numpy only: synced to nodes with the trainer.
"""

from __future__ import annotations

import math
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx

from .zero import FLAT, Layout

#: A rank's slice of a checkpoint, beside the checkpoint's other files.
SLICE_FILE = "zero-rank-{rank}.safetensors"
_SLICE_NAME = re.compile(r"^zero-rank-(\d+)\.safetensors$")


class ZeroError(RuntimeError):
    """A sharded state that cannot be restored (a slice missing, another model)."""


def save_slice(directory: Path, layout: Layout, state: dict[str, mx.array]) -> Path:
    """Write this rank's slice of the optimizer state with its offsets (in the file's
    metadata) into ``directory`` (a checkpoint being written)."""
    lo, hi = layout.bounds()
    path = directory / SLICE_FILE.format(rank=layout.rank)
    mx.save_safetensors(str(path), state, metadata={
        "zero_rank": str(layout.rank), "zero_world": str(layout.world),
        "zero_lo": str(lo), "zero_hi": str(hi), "zero_total": str(layout.total)})
    return path


@dataclass(frozen=True)
class SavedSlice:
    """One rank's slice file as found on this node."""

    path: Path
    rank: int
    world: int
    lo: int
    hi: int
    total: int

    @classmethod
    def read(cls, path: Path) -> SavedSlice:
        _, meta = mx.load(str(path), return_metadata=True)
        try:
            return cls(path, int(meta["zero_rank"]), int(meta["zero_world"]),
                       int(meta["zero_lo"]), int(meta["zero_hi"]), int(meta["zero_total"]))
        except (KeyError, ValueError):
            raise ZeroError(f"{path}: not a ZeRO slice (no offsets in its metadata)") from None


def saved_slices(directory: Path) -> dict[int, SavedSlice]:
    """The slice files in a checkpoint directory, by the rank that wrote them."""
    found = {}
    for path in sorted(directory.glob("zero-rank-*.safetensors")):
        if _SLICE_NAME.match(path.name):
            s = SavedSlice.read(path)
            found[s.rank] = s
    return found


def load_slices(directory: Path, layout: Layout, old_world: int,
                group: mx.distributed.Group, template: dict[str, mx.array]
                ) -> dict[str, mx.array]:
    """This rank's optimizer state in ``layout`` from the slices ``old_world`` ranks
    wrote into ``directory`` (each rank reads its own node's copy); ``template``: the
    state's names, shapes and dtypes (:meth:`ZeroSteps.slice_state` before loading).

    Every rank says which old slices it holds (``all_gather``); where each rank holds
    its own slice of the same layout, it reads it. Otherwise, for each old slice in turn,
    the lowest rank that holds it sends it (``all_gather``: the others send zeros) and
    every rank keeps the part inside its new range; the scalars (the step, the learning
    rate) come with old slice 0. Every rank takes the same decisions (from the same
    gathered table), so they enter the same collectives.
    """
    local = saved_slices(directory)
    for s in local.values():
        if s.total != layout.total or s.world != old_world:
            raise ZeroError(f"{s.path}: a slice of {s.total} elements over {s.world} ranks; "
                            f"this model has {layout.total}, the checkpoint {old_world} ranks")
    held = mx.array([[int(k in local) for k in range(old_world)]], dtype=mx.int32)
    table = (mx.distributed.all_gather(held, group=group, stream=mx.cpu)
             if group.size() > 1 else held).tolist()
    if old_world == layout.world and all(row[r] for r, row in enumerate(table)):
        return dict(mx.load(str(local[layout.rank].path)))
    lo, hi = layout.bounds()
    old = math.ceil(layout.total / old_world) if layout.total else 0
    out: dict[str, mx.array] = {}
    kept: dict[str, list[mx.array]] = {}
    for k in range(old_world):
        holders = [r for r, row in enumerate(table) if row[k]]
        if not holders:
            raise ZeroError(f"{directory}: no rank holds the optimizer slice of old rank {k} "
                            f"(of {old_world}): its host is not in this run")
        sender = holders[0]
        arrays = mx.load(str(local[k].path)) if layout.rank == sender else {}
        o_lo, o_hi = min(layout.total, k * old), min(layout.total, (k + 1) * old)
        for name in sorted(template):
            like = template[name]
            if name.startswith(FLAT + "."):
                mine = arrays.get(name, mx.zeros((o_hi - o_lo,), like.dtype))
                got = _from(mine, old, group, sender)[:o_hi - o_lo]
                mx.eval(got)  # one collective at a time: the ranks' graphs differ
                a0, a1 = max(lo, o_lo), min(hi, o_hi)
                if a0 < a1:
                    kept.setdefault(name, []).append(got[a0 - o_lo:a1 - o_lo])
            elif k == 0:  # a scalar of the optimizer (its step, its learning rate)
                mine = arrays.get(name, mx.zeros_like(like)).reshape(-1)
                out[name] = _from(mine, mine.size, group, sender).reshape(like.shape)
                mx.eval(out[name])
    for name, like in template.items():
        if name.startswith(FLAT + "."):
            parts = kept.get(name, [mx.zeros((0,), like.dtype)])
            out[name] = parts[0] if len(parts) == 1 else mx.concatenate(parts)
    return out


def _from(piece: mx.array, size: int, group: mx.distributed.Group, sender: int) -> mx.array:
    """``sender``'s ``piece`` (padded to ``size``) on every rank."""
    pad = size - piece.size
    if pad:
        piece = mx.concatenate([piece, mx.zeros((pad,), piece.dtype)])
    if group.size() == 1:
        return piece
    return mx.distributed.all_gather(piece[None], group=group)[sender]


#: Where each rank puts its slice before its node's writer moves it into the checkpoint.
STAGING = ".zero-{name}"


def stage_slice(ckpt_dir: Path, step: int, layout: Layout, state: dict[str, mx.array],
                group: mx.distributed.Group) -> Path:
    """This rank's slice of the checkpoint of ``step``, written into a staging directory
    beside it (every rank: a node's ranks all write theirs; its writer then moves them into
    the checkpoint as it writes it, :func:`place_staged`); returns when every rank has."""
    from mlxops.node.protocol import checkpoint_name

    staged = ckpt_dir / STAGING.format(name=checkpoint_name(step))
    staged.mkdir(parents=True, exist_ok=True)
    save_slice(staged, layout, state)
    if group.size() > 1:  # every slice written before any writer moves them
        mx.eval(mx.distributed.all_sum(mx.array([1.0]), group=group, stream=mx.cpu))
    return staged


def place_staged(staged: Path, checkpoint: Path) -> None:
    """Move the staged slices of this node's ranks into the checkpoint being written."""
    for path in sorted(staged.glob("zero-rank-*.safetensors")):
        os.replace(path, checkpoint / path.name)
    shutil.rmtree(staged, ignore_errors=True)


def world_of(directory: Path) -> int | None:
    """The number of ranks that wrote the slices in ``directory`` (None: none there)."""
    for s in saved_slices(directory).values():
        return s.world
    return None

