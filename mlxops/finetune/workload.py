"""Fine-tuning as a workload of the run loop (:mod:`mlxops.trainer.loop`).

What is fine-tuning's own: mlx-lm's model (with the method's adapters, their dropout) and
its loss, the examples of ``data.path`` in length-sorted global batches, a rank's share
cut into micro-batches of at most ``train.micro_batch`` examples, the validation over
``valid.jsonl``, and what a checkpoint holds: the trainable weights only, with the
adapters in mlx-lm's format beside them. Everything else about a run (heartbeat, metrics,
back-off, balance, consistency, validation's best and patience, checkpoints) is the loop's.

A step: this rank's slice of the global batch (:mod:`.data`), in micro-batches, through
:class:`mlxops.trainer.step.Steps` with mlx-lm's ``default_loss`` (one compiled function,
the all-reduce inside, when the slice is one micro-batch). Each micro-batch's loss is the
sum of its tokens' losses times ``world / T``, ``T`` the tokens of the whole global batch
(every rank knows it: the batch is a function of the step), so the mean over ranks is the
mean over every token of the global batch: the world size, ``balance`` and the
micro-batches change only the order of summation (and a rank's weight in the mean needs
no separate scale). The out-of-memory back-off halves ``micro_batch``.

Exact resume: a checkpoint holds the trainable weights, the optimizer state, the step,
the data cursor and the best validation loss; the adapters' dropout draws no RNG state: an
example's mask is a function of ``(train.seed, step, its place in the global batch)``
(:mod:`.dropout`), so it needs no more than the step, and a resume on another world size
or split (``resume --exclude``) drops the same elements: only the order of summation
changes, which the tests hold to float tolerance.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from mlxops.node import protocol
from mlxops.trainer.cursor import DataCursor
from mlxops.trainer.errors import TrainerError
from mlxops.trainer.loop import Figures, Log, Place, ReplicatedOptimizer, Words
from mlxops.trainer.plansearch import cut
from mlxops.trainer.step import WIRE_DTYPES, Steps

from . import dropout as ftdropout
from . import model as ftmodel
from .config import ConfigError, FinetuneConfig, check_world, diff_resume_keys
from .data import Cursor, length_batches, load_examples, micro_batches
from .evaluate import validation_loss
from .objective import make_optimizer, seed_of, token_loss

WORDS = Words(
    unit="example", state="trainable weights", smallest="one example per micro-batch",
    patience="patience: {stale} validations without a loss below {best:.4f} (step "
             "{best_step}, kept in {best_dir}/); stopping at step {step}; resume with a "
             "larger train.patience to go on")


class FinetuneWorkload(ReplicatedOptimizer):
    """Fine-tuning's side of the loop's :class:`~mlxops.trainer.loop.Workload` protocol."""

    words = WORDS
    trainable_only = True
    replicated = True

    def __init__(self, cfg: FinetuneConfig) -> None:
        self.cfg = cfg
        self.steps: Steps | None = None  # type: ignore[assignment]

    def check_world(self, world: int) -> None:
        check_world(self.cfg, world)

    def diff_resume_keys(self, saved: dict[str, Any]) -> list[str]:
        return diff_resume_keys(saved, self.cfg)

    def build(self, place: Place, counts: list[int], log: Log) -> None:
        cfg, t = self.cfg, self.cfg.train
        self.place, self.counts = place, counts
        tokenizer = self.build_model()
        self.trainable = ftmodel.count_trainable(self.model)
        self._data(tokenizer, log)
        self.optimizer = make_optimizer(cfg, self.total)
        self.model.train()
        self.optimizer.init(self.model.trainable_parameters())
        mx.eval(self.model.parameters(), self.optimizer.state)
        self.micro_cap = t.micro_batch  # halved by an out-of-memory back-off

    def build_model(self) -> Any:
        """The model with the method's adapters (``self.model``, ``self.row_seeds``,
        ``self.num_layers``); returns the tokenizer."""
        cfg = self.cfg
        mx.random.seed(cfg.train.seed)  # the adapters' initialisation draws from it
        self.model, tokenizer = ftmodel.load_base(cfg)
        ftmodel.apply_method(self.model, cfg)
        self.row_seeds = ftdropout.install(self.model, cfg.method.dropout)
        blocks = len(self.model.layers)
        self.num_layers = blocks if cfg.method.num_layers == -1 else cfg.method.num_layers
        return tokenizer

    def _data(self, tokenizer: Any, log: Log) -> None:
        """The examples, the cursor over them, the validation batches and the schedule."""
        cfg, t = self.cfg, self.cfg.train
        train, valid, dropped = load_examples(cfg, tokenizer)
        if dropped:
            log(f"data: {dropped} examples left out: every target token is masked "
                f"(prompt masking, max_seq_len {t.max_seq_len})")
        self.cursor = Cursor(train, t.global_batch, t.seed, t.max_seq_len)
        self.n_train, self.valid = len(train), valid
        batches = length_batches(valid, t.global_batch)
        self.val_batches = batches if t.eval_batches == -1 else batches[:t.eval_batches]
        self.total = t.epochs * self.cursor.per_epoch if t.epochs else t.steps
        self.stop = min(t.stop_at or self.total, self.total)

    @property
    def pieces(self) -> int:
        """This rank's micro-batches per step: its share cut into at most micro_cap each."""
        rows = self.counts[self.place.rank]
        return -(-rows // self.micro_cap)

    def _micro(self) -> int:
        """The largest micro-batch of the cut (:func:`~mlxops.trainer.plansearch.cut`, the
        rule the memory plan searches by)."""
        return cut(self.counts[self.place.rank], self.micro_cap)

    def start_line(self) -> str:
        total = ftmodel.count_all(self.model)
        return (f"start: {self.trainable:,} trainable of {total:,} parameters "
                f"({self.cfg.method.type}), world {self.place.world}, split {self.counts} = "
                f"global {self.cfg.train.global_batch}; {self.n_train} train / "
                f"{len(self.valid)} valid examples, {self.cursor.per_epoch} steps per epoch, "
                f"{self.total} steps")

    def check_validation(self) -> None:
        if not self.val_batches:
            path = Path(self.cfg.data.path or "") / "valid.jsonl"
            raise ConfigError(f"{path}: train.eval_every: {self.cfg.train.eval_every}, but "
                              "there is no validation example; add valid.jsonl or set "
                              "train.eval_every: 0")

    def resplit(self, counts: list[int]) -> None:
        self.counts = counts  # each example's weight is in its loss: nothing to recompile

    def compile(self) -> None:
        t, p = self.cfg.train, self.place
        self.steps = Steps(self.model, self.optimizer, p.group, mx.float32,
                           t.grad_clip, WIRE_DTYPES[t.grad_reduce_dtype],
                           loss=ftdropout.seeded(token_loss, self.row_seeds))

    def batches(self, step: int) -> list[tuple[mx.array, ...]]:
        """This rank's micro-batches of ``step``: tokens, lengths, the step's weight
        ``world / T`` and each row's dropout seed."""
        p = self.place
        weight = mx.array(p.world / max(1, self.cursor.step_tokens(step)), mx.float32)
        rows = self.cursor.rank_rows(step, self.counts, p.rank)
        first = sum(self.counts[:p.rank])  # the place of rows[0] in the global batch
        seed = self.cfg.train.seed
        places = range(first, first + len(rows))
        # The seeds are only read with dropout; zeros spare the hashing otherwise.
        seeds = np.array([seed_of(seed, step, i) for i in places] if self.cfg.method.dropout
                         else [0] * len(rows), np.uint32)
        pieces = self.pieces
        parts = np.array_split(seeds, min(pieces, len(rows)))
        return [(mx.array(x), mx.array(lengths), weight, mx.array(part))
                for (x, lengths), part in zip(
                    micro_batches(self.cursor.examples, rows, pieces,
                                  self.cfg.train.max_seq_len), parts, strict=True)]

    def divisor(self, micro_batches: int) -> float:
        return 1.0  # each micro-batch's loss is already its share of the global mean

    def tokens(self, step: int) -> int:
        return self.cursor.step_tokens(step)

    def can_back_off(self) -> bool:
        return self._micro() > 1

    def back_off(self) -> str:
        old, old_micro = self.pieces, self._micro()
        self.micro_cap = max(1, -(-old_micro // 2))
        return (f"accumulation {old} -> {self.pieces} (micro_batch {old_micro} -> "
                f"{self._micro()})")

    def shape(self) -> str:
        return f"split {self.counts}, micro {self._micro()} x accum {self.pieces}"

    def evaluate(self) -> float | None:
        return validation_loss(self.model, self.valid, self.val_batches, self.counts,
                               self.place.rank, self.pieces, self.cfg.train.max_seq_len,
                               self.place.group)

    def figures(self) -> Figures:
        rows = self.counts[self.place.rank]
        return Figures(micro_batch=self._micro(), accumulation=min(self.pieces, rows),
                       trainable_params=self.trainable)

    def weights(self) -> dict[str, mx.array]:
        return ftmodel.trainable_weights(self.model)

    def load_weights(self, weights: dict[str, mx.array], path: Path) -> None:
        unknown = set(weights) - set(ftmodel.trainable_weights(self.model))
        if unknown:
            raise TrainerError(f"{path}: weights the model does not train: "
                               f"{sorted(unknown)[:3]}")
        self.model.load_weights(list(weights.items()), strict=False)

    def checkpoint_state(self, step: int) -> dict[str, Any]:
        return {"data_cursor": step, "data_position": self.cursor.position(step).to_dict(),
                "rng": {"seed": self.cfg.train.seed, "rule": "dropout per example from "
                        "(train.seed, step, place in the global batch)"},
                "micro_batch": self._micro(), "accumulation": self.pieces,
                "trainable": self.trainable}

    def restore_state(self, state: dict[str, Any], path: Path, log: Log) -> None:
        step = state["step"]
        expected = self.cursor.position(step)
        if DataCursor.from_dict(state["data_position"]) != expected:
            raise TrainerError(f"{path}: data cursor {state['data_position']} does not "
                               f"match step {step} ({expected.to_dict()})")

    def checkpoint_files(self) -> Callable[[Path], None] | None:
        config = ftmodel.adapter_config(self.cfg, self.num_layers)

        def adapters(tmp: Path) -> None:
            ftmodel.write_adapters(tmp, tmp / protocol.CKPT_MODEL, config)

        return adapters

    def close(self) -> None:
        pass
