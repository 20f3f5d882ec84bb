"""The bundled trainer as a workload of the run loop (:mod:`.loop`).

What is the bundled trainer's own: a decoder-only :class:`~.model.Transformer` built from
``model:``, AdamW with warmup and cosine decay, the corpus of ``data:`` read ahead by
:class:`~.prefetch.Prefetcher`, each rank's ``micro_batch``-sized pieces of its share of
the global batch (the largest divisor of the share not above the cap, so every
micro-batch has one shape), the compiled :class:`~.step.Steps` weighted by the rank's
share, the compiled evaluation over the corpus's validation split, and what a
checkpoint holds beyond the loop's: every parameter, the RNG key (restored exactly: MLX's
global key cannot be set back) and the data cursor, checked on resume against where the
corpus reads now. Everything else about a run is the loop's.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.optimizers as optim
from mlx.utils import tree_flatten

from . import balance, optimizers, plan
from .config import TrainerConfig, check_world, diff_resume_keys
from .cursor import DataCursor
from .data import Batches, make_source, split_rank
from .errors import TrainerError
from .evaluate import Evaluator
from .loop import GB, Figures, Log, Loop, Place, Words
from .model import Transformer, count_params
from .prefetch import Prefetcher
from .step import WIRE_DTYPES, Steps

__all__ = ["TrainerError", "TrainerWorkload", "make_optimizer", "train", "trainer_loop"]

WORDS = Words(
    unit="sample", state="parameters", smallest="micro_batch 1",
    patience="patience: {stale} evaluations without a new best validation loss (best "
             "{best:.4f} at step {best_step}, kept in {best_dir}/); ending at step {step}; "
             "resume with a larger train.patience to go on")


def make_optimizer(cfg: TrainerConfig) -> optim.Optimizer:
    """``train:``'s optimizer, its schedule spanning ``train.steps`` (:mod:`.optimizers`)."""
    return optimizers.make_optimizer(cfg.train, cfg.train.steps)


class TrainerWorkload:
    """The bundled trainer's side of the loop's :class:`~.loop.Workload` protocol."""

    words = WORDS
    trainable_only = False
    replicated = True

    def __init__(self, cfg: TrainerConfig) -> None:
        self.cfg = cfg
        self.total = cfg.train.steps
        self.stop = cfg.train.stop_at or cfg.train.steps
        self.steps: Steps | None = None  # type: ignore[assignment]

    def check_world(self, world: int) -> None:
        check_world(self.cfg, world)

    def diff_resume_keys(self, saved: dict[str, Any]) -> list[str]:
        return diff_resume_keys(saved, self.cfg)

    def build(self, place: Place, counts: list[int], log: Log) -> None:
        cfg, t = self.cfg, self.cfg.train
        self.place = place
        self.source = make_source(cfg.data, cfg.model.vocab_size, cfg.model.seq_len)
        # The rows of the next steps, read while this one computes (trainer/prefetch.py).
        self.prefetch = Prefetcher(self.source.samples, lambda s: self.batch_plan.plan(s),
                                   cfg.data.prefetch)
        self.micro_cap = t.micro_batch  # halved by an out-of-memory back-off
        self.resplit(counts)
        self.dtype = mx.bfloat16 if t.dtype == "bfloat16" else mx.float32
        self.build_model()
        # The trainer's own RNG key, saved and restored exactly (MLX's global key cannot be
        # set back); training itself draws no random numbers (no dropout).
        self.key = mx.random.key(t.seed)
        mx.eval(self.model.parameters(), self.optimizer.state)

    def build_model(self) -> None:
        """The model, its optimizer and its evaluation (pipeline stages: their part)."""
        cfg, t = self.cfg, self.cfg.train
        mx.random.seed(t.seed)
        self.model = Transformer(cfg.model, grad_checkpoint=t.grad_checkpoint)
        self.optimizer = make_optimizer(cfg)
        self.optimizer.init(self.model.trainable_parameters())
        self.evaluator = Evaluator(self.model)

    def start_line(self) -> str:
        world, t = self.place.world, self.cfg.train
        if len(set(self.counts)) == 1:
            batch = f"micro {self.micro} x accum {self.accum} x world {world}"
        else:
            batch = f"split {self.counts} (rank 0: micro {self.micro} x accum {self.accum})"
        return (f"start: {count_params(self.model):,} parameters, world {world}, {batch} = "
                f"global {t.global_batch}; memory plan {self._planned() / GB:.2f} GB per rank")

    def check_validation(self) -> None:
        self.source.validation(0, 1)  # a corpus without a validation split: refused

    def resplit(self, counts: list[int]) -> None:
        """Take ``counts[r]`` sequences of every global batch on rank r from now on."""
        p = self.place
        self.counts = counts
        self.batch_plan = Batches(self.source, self.cfg.train.global_batch, p.rank, p.world,
                                  counts)
        self.micro, self.accum = split_rank(counts[p.rank], self.micro_cap)
        if self.steps is not None:
            self.compile()  # this rank's weight in the mean changed with its share

    def compile(self) -> None:
        t, p = self.cfg.train, self.place
        self.steps = Steps(self.model, self.optimizer, p.group, self.dtype, t.grad_clip,
                           WIRE_DTYPES[t.grad_reduce_dtype], balance.scale(self.counts, p.rank))

    def batches(self, step: int) -> list[tuple[mx.array, ...]]:
        rows = self.batch_plan.micro_batches(step, self.micro, self.prefetch.rows(step))
        return [(mx.array(x), mx.array(y)) for x, y in rows]

    def divisor(self, micro_batches: int) -> float:
        return float(micro_batches)  # each micro-batch's loss is its mean: average them

    def tokens(self, step: int) -> int:
        return self.cfg.train.global_batch * self.cfg.model.seq_len

    def can_back_off(self) -> bool:
        return self.micro > 1

    def back_off(self) -> str:
        old = (self.micro, self.accum)
        self.micro_cap = max(1, self.micro // 2)
        self.micro, self.accum = split_rank(self.counts[self.place.rank], self.micro_cap)
        return f"micro {old[0]} x accum {old[1]} -> micro {self.micro} x accum {self.accum}"

    def shape(self) -> str:
        return f"micro {self.micro} x accum {self.accum}"

    def evaluate(self) -> float | None:
        """The validation loss now (every rank: it all-sums)."""
        return self.evaluator.loss(self.batch_plan, self.micro, self.cfg.train.eval_batches,
                                   self.place.group)

    def _planned(self) -> int:
        """The memory plan's peak for this rank as it runs now (trainer/plan.py)."""
        return plan.estimate(self.cfg, self.micro, self.accum, self.place.world).total

    def figures(self) -> Figures:
        return Figures(micro_batch=self.micro, accumulation=self.accum,
                       planned_memory=self._planned())

    def weights(self) -> dict[str, mx.array]:
        return dict(tree_flatten(self.model.parameters()))

    def load_weights(self, weights: dict[str, mx.array], path: Path) -> None:
        self.model.load_weights(list(weights.items()), strict=True)

    def _cursor(self, step: int) -> int:
        return self.batch_plan.cursor(step)

    def checkpoint_state(self, step: int) -> dict[str, Any]:
        at = self.source.cursor(self._cursor(step))
        return {"data_cursor": self._cursor(step), "data_position": at.to_dict() if at else None,
                "rng_key": self.key.tolist(), "micro_batch": self.micro,
                "accumulation": self.accum}

    def restore_state(self, state: dict[str, Any], path: Path, log: Log) -> None:
        step = state["step"]
        self.key = mx.array(state["rng_key"], dtype=mx.uint32)
        if state["data_cursor"] != self._cursor(step):
            raise TrainerError(f"{path}: data cursor {state['data_cursor']} does not match "
                               f"step {step}")
        saved_at = state.get("data_position")
        now_at = self.source.cursor(self._cursor(step))
        if saved_at is not None and now_at is not None and \
                DataCursor.from_dict(saved_at) != now_at:
            raise TrainerError(f"{path}: the data cursor {saved_at} is not where step "
                               f"{step} reads now ({now_at.to_dict()}): the corpus "
                               "changed since the checkpoint")

    def checkpoint_files(self) -> Callable[[Path], None] | None:
        return None

    def close(self) -> None:
        self.prefetch.close()


def trainer_loop(cfg: TrainerConfig, resume: bool = False) -> Loop:
    """The run loop over the bundled trainer, ready to :meth:`~.loop.Loop.run`: data
    parallel, or pipeline stages with ``train.stages`` (:mod:`.pipelinerun`)."""
    if cfg.train.stages is not None:
        from .pipelinerun import PipelineTrainerWorkload  # it builds on TrainerWorkload

        return Loop(PipelineTrainerWorkload(cfg), resume)
    return Loop(TrainerWorkload(cfg), resume)


def train(cfg: TrainerConfig, resume: bool = False) -> None:
    trainer_loop(cfg, resume).run()
