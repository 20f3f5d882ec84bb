"""One vocabulary for the knobs every training program has: one key, one meaning.

The bundled trainer's config (:mod:`.config`) and fine-tuning's
(:mod:`mlxops.finetune.config`) both take their ``train:`` section from
:class:`TrainKeys`: the keys the run loop (:mod:`.loop`) reads (steps, the batch and its
micro-batches, the optimizer and its schedule, checkpoints, logging, validation and
patience, balance, consistency) are declared here once, with their meaning; a program
adds its own keys (the trainer's ``dtype``, fine-tuning's ``epochs``, ``max_seq_len``) and
may give a key another default (:func:`default`), never another meaning.

Keys that used to be spelled otherwise (:data:`RENAMED`) and keys that are misspelt are
refused with the key to use: ``job.yml: finetune.train.save_every: unknown key; did you
mean train.checkpoint_every? (renamed)``; a near miss is found with :mod:`difflib`
(:func:`unknown_key`). A checkpoint written under an old spelling still resumes: its
saved config is read through :func:`upgrade`.

Standard library only (the controller validates jobs with it; nodes run it).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import MISSING, Field, dataclass, field
from typing import Any

from .configfile import ConfigError

OPTIMIZERS = ("adamw", "adam", "sgd")
SCHEDULES = ("cosine", "constant")
DTYPES = ("float32", "bfloat16")


def key_field(default: Any, help: str) -> Any:
    """A dataclass field whose help text ends up in ``--help`` and the docs (every config
    record's keys: these, the trainer's, fine-tuning's)."""
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


_f = key_field  # the short name the key tables below are written with


@dataclass
class TrainKeys:
    """The ``train:`` keys every training program has (defaults: the bundled trainer's)."""

    steps: int = _f(1000, "optimizer steps in total (the learning-rate schedule spans them)")
    stop_at: int = _f(0, "stop after this step, leaving the run resumable; 0 = the last")
    global_batch: int = _f(32, "sequences (examples) per optimizer step, over all ranks")
    micro_batch: int = _f(8, "sequences (examples) per rank per forward/backward, at most; "
                          "a rank's share is cut into micro-batches of at most this many "
                          "and their gradients accumulated; the out-of-memory back-off "
                          "halves it")
    seed: int = _f(0, "seed of the initialisation (and of fine-tuning's dropout and data "
                   "order)")
    optimizer: str = _f("adamw", "adamw, adam or sgd")
    lr: float = _f(3e-4, "peak learning rate")
    min_lr: float = _f(0.0, "learning rate at the end of the cosine decay")
    schedule: str = _f("cosine", "after the warmup: cosine (decay to min_lr at the last "
                       "step) or constant")
    warmup: int = _f(0, "linear warmup steps from 0")
    weight_decay: float = _f(0.0, "weight decay (adamw only)")
    grad_clip: float = _f(0.0, "clip the global gradient norm to this; 0 = off")
    checkpoint_every: int = _f(100, "write a checkpoint every N steps, and at the run's "
                               "last step; 0 = only at the last")
    keep: int = _f(3, "keep the newest K checkpoints (best/ is kept besides)")
    log_every: int = _f(10, "print and write metrics every N steps")
    grad_checkpoint: bool = _f(False, "recompute each block in backward (mx.checkpoint)")
    grad_reduce_dtype: str = _f("float32", "gradients on the network in the all-reduce: "
                                "float32 | bfloat16 (half the bytes; summed across ranks in "
                                "bfloat16, everything else float32)")
    consistency_every: int = _f(100, "every N steps the ranks compare a checksum of what "
                                "they train and its optimizer state; on a mismatch rank "
                                "0's copy is sent to all; 0 = off")
    balance: list | str = _f("equal", "how the global batch is split over ranks: equal | "
                             "auto (measured in the first steps) | a list of weights, one "
                             "per rank (relative speeds)")
    eval_every: int = _f(0, "measure the validation loss every N steps (and at the last); "
                         "0 = off")
    eval_batches: int = _f(4, "global batches of validation data per evaluation")
    patience: int = _f(0, "end the run (resumably) after N evaluations in a row without a "
                       "new best validation loss; 0 = off; needs eval_every")


def default(name: str, value: Any, help: str | None = None) -> Any:
    """:class:`TrainKeys`' field ``name`` with another default (a program's own), the same
    meaning (its help, unless ``help`` words it for that program)."""
    base: Field = TrainKeys.__dataclass_fields__[name]
    return _f(value, help or base.metadata["help"])


#: Old spellings: the key to use now, and what changed.
RENAMED: dict[str, tuple[str, str]] = {
    "train.save_every": ("train.checkpoint_every", "renamed"),
    "train.accumulation": ("train.micro_batch", "the back-off now halves micro_batch; "
                           "micro-batches = ceil(share / micro_batch)"),
    "optimizer.name": ("train.optimizer", "moved"),
    "optimizer.lr": ("train.lr", "moved"),
    "optimizer.min_lr": ("train.min_lr", "moved"),
    "optimizer.schedule": ("train.schedule", "moved"),
    "optimizer.warmup": ("train.warmup", "moved"),
    "optimizer.weight_decay": ("train.weight_decay", "moved"),
    "optimizer.grad_clip": ("train.grad_clip", "moved"),
}


def unknown_key(where: str, key: str, known: Iterable[str]) -> ConfigError:
    """The one-line error for ``key``: the key to use for an old spelling, else the
    closest known key (difflib), else none."""
    if key in RENAMED:
        new, why = RENAMED[key]
        return ConfigError(f"{where}: {key}: unknown key; did you mean {new}? ({why})")
    known = list(known)
    section, dot, sub = key.partition(".")
    # Within its section when that exists: "train." alone would make any two keys close.
    siblings = [k.partition(".")[2] for k in known if dot and k.startswith(section + ".")]
    if siblings:
        close = [f"{section}.{k}" for k in difflib.get_close_matches(sub, siblings, n=1)]
    else:
        close = difflib.get_close_matches(key, known, n=1)
    hint = f"; did you mean {close[0]}?" if close else ""
    return ConfigError(f"{where}: {key}: unknown key{hint}")


def known_keys(sections: Mapping[str, type]) -> list[str]:
    """``section.key`` of every key of a config's sections, and ``out``."""
    out = ["out"]
    for name, cls in sections.items():
        out += [f"{name}.{f}" for f in cls.__dataclass_fields__]
    return out


def upgrade(saved: Mapping[str, Any]) -> dict[str, Any]:
    """A checkpoint's saved config (``{section: {key: value}}``) with its keys as they are
    spelt now (the pure renames of :data:`RENAMED`; the new spelling wins)."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in saved.items()}
    for old, (new, why) in RENAMED.items():
        if why not in ("renamed", "moved"):
            continue
        section, sub = old.split(".")
        if isinstance(out.get(section), dict) and sub in out[section]:
            value = out[section].pop(sub)
            new_section, new_sub = new.split(".")
            out.setdefault(new_section, {}).setdefault(new_sub, value)
    return out


def field_default(f: Field) -> Any:
    """A dataclass field's default value."""
    return f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
