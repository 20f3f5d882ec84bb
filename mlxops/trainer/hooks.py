"""Test hooks: failures the trainer's tests cause on purpose, by environment variable.

Each is read when it may fire and does nothing when unset (docs/trainer.md, Environment):

- ``MLXOPS_TRAINER_FAKE_OOM=STEP`` (every rank) or ``RANK:STEP``: one simulated
  out-of-memory at that step, in the form a Mac raises (a Metal command buffer's,
  :data:`.oom.COMMAND_BUFFER_OOM`), for the out-of-memory back-off;
- ``MLXOPS_TRAINER_FAKE_SLOW=RANK:SECONDS``: that rank's compute takes SECONDS longer per
  sequence, as on a slower machine (``train.balance: auto``);
- ``MLXOPS_TRAINER_FAKE_DIVERGE=RANK:STEP``: after that step, that rank's first parameter
  array moves by 0.01, as a bit flip or a bug would make it (``train.consistency_every``);
- ``MLXOPS_TRAINER_HOLD=PATH``: after a step (its checkpoint written), while the file PATH
  (``~``: the rank's home) holds a step number at most this one, the rank waits, its
  heartbeat going on: a test holds a job at a step however fast the machine is, and lets
  it go on by writing a later step into the file (atomically) or removing it.
- ``MLXOPS_TRAINER_FAKE_MEMORY=BYTES``: the node's memory as a rank reads it for
  ``train.shard_optimizer: auto`` in a run started by hand (and no GPU working set), as on
  a smaller machine.
(``MLXOPS_TRAINER_CKPT_DELAY`` lives where it acts, in checkpoint.py.)
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten

_fired: set[str] = set()


def _rank_step(name: str, rank: int, step: int, rank_optional: bool = False) -> bool:
    hook = os.environ.get(name, "")
    if not hook:
        return False
    who, _, at = hook.rpartition(":") if rank_optional else hook.partition(":")
    return int(at) == step and (not who or int(who) == rank)


def fake_oom(rank: int, step: int) -> bool:
    """True once, at the hook's step: the caller raises a simulated out-of-memory."""
    if "oom" in _fired or not _rank_step("MLXOPS_TRAINER_FAKE_OOM", rank, step, True):
        return False
    _fired.add("oom")
    return True


def fake_slow(rank: int, sequences: int) -> None:
    hook = os.environ.get("MLXOPS_TRAINER_FAKE_SLOW", "")
    who, _, seconds = hook.partition(":")
    if hook and int(who) == rank:
        time.sleep(float(seconds) * sequences)


def fake_memory() -> int | None:
    """``MLXOPS_TRAINER_FAKE_MEMORY``'s bytes, or None when unset."""
    hook = os.environ.get("MLXOPS_TRAINER_FAKE_MEMORY", "")
    return int(hook) if hook else None


def fake_diverge(rank: int, step: int, model: nn.Module) -> None:
    if _rank_step("MLXOPS_TRAINER_FAKE_DIVERGE", rank, step):
        name, value = tree_flatten(model.parameters())[0]
        model.update(tree_unflatten([(name, value + 0.01)]))
        mx.eval(model.parameters())


HOLD_POLL = 0.1  # seconds between two reads of the hold file


def hold(step: int, beat: Callable[[], None]) -> None:
    """Wait here while ``MLXOPS_TRAINER_HOLD``'s file holds a step <= ``step``, calling
    ``beat`` (the progress heartbeat) at every read. A file being written (not a number
    yet) still holds."""
    path = os.environ.get("MLXOPS_TRAINER_HOLD", "")
    if not path:
        return
    path = os.path.expanduser(path)
    while True:
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            return  # no file: go on
        if text.isdigit() and int(text) > step:
            return
        beat()
        time.sleep(HOLD_POLL)
