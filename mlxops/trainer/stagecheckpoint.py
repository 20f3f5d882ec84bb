"""A pipeline checkpoint: every stage's weights and optimizer state stored by name, so a
run resumes on another number of stages (another split of the same layers).

Stage ``s`` writes ``stage-<s>.safetensors`` into the checkpoint directory: its weights
under their names in the whole model (``blocks.7.mlp.up.weight``) and its optimizer's
state under ``optimizer.<name>.<slot>`` (``optimizer.blocks.7.mlp.up.weight.m``), with
``optimizer.step`` and ``optimizer.learning_rate``; the file's metadata holds the step,
the stage and the layers it held. A stage resuming reads every ``stage-*.safetensors``
there and takes the names it holds now, wherever they were written (a tied embedding is in
the first and the last stage's file, the same bits in both). A name it needs that no file
has is refused, naming it.

Each file is written under a temporary name and renamed into place, so a file present is
complete; whether every stage's file is there is the run's checkpoint rule (the node
protocol's), not this module's.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten

from .pipeline import shaped

OPTIMIZER = "optimizer."
PATTERN = "stage-*.safetensors"


class StageCheckpointError(ValueError):
    """A checkpoint that cannot resume this stage (the message names the file and key)."""


def stage_file(directory: Path, stage: int) -> Path:
    return directory / f"stage-{stage}.safetensors"


def _same(name: str) -> str:
    return name


def _weights(model: Any, trainable_only: bool) -> Any:
    return model.trainable_parameters() if trainable_only else model.parameters()


def save(directory: Path, stage: int, model: Any, optimizer: Any, step: int, *,
         name: Callable[[str], str] = _same, trainable_only: bool = False) -> Path:
    """Write stage ``stage``'s weights and optimizer state after ``step`` steps.

    ``name``: a parameter's name in the whole model from its name in ``model`` (a
    fine-tuning stage numbers its blocks from 0); ``trainable_only``: the trainable
    weights alone (fine-tuning: the base model is read from its own files)."""
    directory.mkdir(parents=True, exist_ok=True)
    arrays = {name(k): v for k, v in tree_flatten(_weights(model, trainable_only))}
    arrays.update({OPTIMIZER + name(k): v for k, v in tree_flatten(optimizer.state)})
    final = stage_file(directory, stage)
    tmp = directory / f".tmp-{final.name}-{os.getpid()}.safetensors"
    mx.save_safetensors(str(tmp), arrays, metadata={"step": str(step), "stage": str(stage)})
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, final)
    return final


def read(directory: Path) -> tuple[dict[str, mx.array], int]:
    """Every stage file's arrays by name, and the step they were written after."""
    files = sorted(directory.glob(PATTERN))
    if not files:
        raise StageCheckpointError(f"{directory}: no {PATTERN}")
    arrays: dict[str, mx.array] = {}
    steps = set()
    for path in files:
        loaded, meta = mx.load(str(path), return_metadata=True)
        arrays.update(loaded)
        steps.add(int(meta.get("step", -1)))
    if len(steps) != 1:
        raise StageCheckpointError(f"{directory}: stage files of different steps {sorted(steps)}")
    return arrays, steps.pop()


def load(directory: Path, model: Any, optimizer: Any, *, name: Callable[[str], str] = _same,
         trainable_only: bool = False) -> int:
    """Set ``model``'s weights and ``optimizer``'s state from the checkpoint in
    ``directory`` by name (``name`` and ``trainable_only`` as :func:`save`'s); returns the
    step to resume after."""
    found, step = read(directory)
    wanted = dict(tree_flatten(_weights(model, trainable_only)))
    arrays = {k: found[name(k)] for k in wanted if name(k) in found}
    arrays.update({OPTIMIZER + k: found[OPTIMIZER + name(k)]
                   for k, _ in _optimizer_names(model, optimizer)
                   if OPTIMIZER + name(k) in found})
    missing = [name(k) for k in wanted if k not in arrays]
    if missing:
        raise StageCheckpointError(f"{directory}: {missing[0]}: not in any stage's file "
                                   f"({len(missing)} names missing)")
    for k, v in wanted.items():
        if arrays[k].shape != v.shape:
            raise StageCheckpointError(f"{directory}: {k}: shape {arrays[k].shape}, this "
                                       f"stage has {v.shape}")
    model.update(shaped(_weights(model, trainable_only), arrays))
    state = []
    for k, v in _optimizer_names(model, optimizer):
        key = OPTIMIZER + k
        if key not in arrays:
            raise StageCheckpointError(f"{directory}: {OPTIMIZER + name(k)}: not in any "
                                       "stage's file")
        if arrays[key].shape != v.shape:
            raise StageCheckpointError(f"{directory}: {key}: shape {arrays[key].shape}, "
                                       f"this stage has {v.shape}")
        state.append((k, arrays[key]))
    optimizer.state = shaped(optimizer.state, dict(state))
    mx.eval(model.parameters(), optimizer.state)
    return step


def _optimizer_names(model: Any, optimizer: Any) -> list[tuple[str, Any]]:
    """The optimizer's state for ``model``'s trainable weights, by name (initialised)."""
    optimizer.init(model.trainable_parameters())
    return tree_flatten(optimizer.state)
