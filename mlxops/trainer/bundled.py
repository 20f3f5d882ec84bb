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

With ``train.shard_optimizer`` (true, or auto when the unsharded plan does not fit some
rank's budget) the optimizer state is sharded over the ranks (ZeRO-1, :mod:`.zero`): the
steps are :class:`~.zero.ZeroSteps`, each rank checkpoints its slice beside the node's
checkpoint and resumes it (re-sliced on another number of ranks), and the consistency
check compares the weights alone (the optimizer state is not the same on every rank).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.optimizers as optim
from mlx.utils import tree_flatten

from mlxops.node.memory import recommended_working_set

from . import balance, hooks, optimizers, plan, shardchoice, zero, zero_checkpoint
from .config import SHARD_AUTO, TrainerConfig, check_world, diff_resume_keys
from .cursor import DataCursor
from .data import Batches, make_source, split_rank
from .distributed import all_gather_cpu, host_names
from .errors import TrainerError
from .evaluate import Evaluator
from .loop import GB, Figures, Log, Place, ReplicatedOptimizer, Words
from .model import Transformer, count_params
from .prefetch import Prefetcher
from .step import WIRE_DTYPES, Steps, compute_backend

WORDS = Words(
    unit="sample", state="parameters", smallest="micro_batch 1",
    patience="patience: {stale} evaluations without a new best validation loss (best "
             "{best:.4f} at step {best_step}, kept in {best_dir}/); ending at step {step}; "
             "resume with a larger train.patience to go on")


def make_optimizer(cfg: TrainerConfig) -> optim.Optimizer:
    """``train:``'s optimizer, its schedule spanning ``train.steps`` (:mod:`.optimizers`)."""
    return optimizers.make_optimizer(cfg.train, cfg.train.steps)


class TrainerWorkload(ReplicatedOptimizer):
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
        self.build_model(log)
        # The trainer's own RNG key, saved and restored exactly (MLX's global key cannot be
        # set back); training itself draws no random numbers (no dropout).
        self.key = mx.random.key(t.seed)
        mx.eval(self.model.parameters(), self.optimizer.state)

    def build_model(self, log: Log) -> None:
        """The model, its optimizer and its evaluation (pipeline stages: their part)."""
        cfg, t = self.cfg, self.cfg.train
        mx.random.seed(t.seed)
        self.model = Transformer(cfg.model, grad_checkpoint=t.grad_checkpoint)
        self.optimizer = make_optimizer(cfg)
        self.shard: zero.Shard | None = None
        if self._sharded(log):
            self.shard = zero.Shard(self.model, self.optimizer, self.place.group, self.dtype)
        else:
            self.optimizer.init(self.model.trainable_parameters())
        self.evaluator = Evaluator(self.model)

    def _sharded(self, log: Log) -> bool:
        """Whether this run shards the optimizer state: ``train.shard_optimizer``, and with
        auto, whether the unsharded plan exceeds some rank's budget (every rank asks its
        own node; they agree, all_gather). A job's ranks get true or false: the controller
        decides auto at launch from each node's facts (mlxops/jobs/sharding.py); this is
        a run started by hand."""
        mode, p = self.cfg.train.shard_optimizer, self.place
        if p.world < 2 or mode is False:
            return False
        if mode is not True and mode != SHARD_AUTO:
            return False
        if mode is True:
            return True
        hosts = host_names(p.group)
        ranks_here = hosts.count(hosts[p.rank])
        faked = hooks.fake_memory()
        memory = faked or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        working_set = None if faked else recommended_working_set()
        budget, _ = plan.budget_bytes(memory, working_set, ranks_here)
        mine = [budget, self._planned(shard=False), self._planned(shard=True)]
        rows = all_gather_cpu(mx.array([mine], dtype=mx.int64), p.group).tolist()
        budgets, whole, sharded = zip(*rows, strict=True)
        found = shardchoice.choose(p.world, budgets, whole, sharded)  # the controller's rule
        if found.shard:
            log(f"shard_optimizer: auto: the unsharded plan exceeds the budget of rank(s) "
                f"{list(found.over)}: the optimizer state is sharded over the ranks (ZeRO-1)")
        elif not found.fits:
            log(f"shard_optimizer: auto: rank(s) {list(found.short)} fit neither unsharded "
                "nor sharded: not sharded")
        return found.shard

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
        args = (self.model, self.optimizer, p.group, self.dtype, t.grad_clip,
                WIRE_DTYPES[t.grad_reduce_dtype], balance.scale(self.counts, p.rank))
        self.steps = (Steps(*args) if self.shard is None
                      else zero.ZeroSteps(*args, shard=self.shard))

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

    def _planned(self, shard: bool | None = None) -> int:
        """The memory plan's peak for this rank as it runs now (trainer/plan.py)."""
        sharded = self.shard is not None if shard is None else shard
        return plan.estimate(self.cfg, self.micro, self.accum, self.place.world,
                             shard=sharded, backend=compute_backend()).total

    def figures(self) -> Figures:
        return Figures(micro_batch=self.micro, accumulation=self.accum,
                       planned_memory=self._planned())

    def weights(self) -> dict[str, mx.array]:
        if self.shard is not None:
            return self._gathered
        return dict(tree_flatten(self.model.parameters()))

    def load_weights(self, weights: dict[str, mx.array], path: Path) -> None:
        self.model.load_weights(list(weights.items()), strict=True)

    # -- the optimizer state: replicated, or this rank's slice ------------------------------

    @property
    def replicated_optimizer(self) -> Any:
        """What the consistency check compares of the optimizer: all of it, or nothing
        where each rank holds its own slice."""
        return super().replicated_optimizer if self.shard is None else zero.NO_OPTIMIZER

    def restore_optimizer(self, saved: dict[str, mx.array], path: Path) -> None:
        slices = zero_checkpoint.world_of(path)
        if (slices is not None) != (self.shard is not None):
            raise TrainerError(
                f"{path}: saved with the optimizer state {'sharded' if slices else 'whole'};"
                f" this run {'shards' if self.shard else 'does not shard'} it: set "
                "train.shard_optimizer as it was")
        if self.shard is None:
            super().restore_optimizer(saved, path)
            return
        state = zero_checkpoint.load_slices(path, self.shard.layout, slices, self.place.group,
                                 dict(tree_flatten(self.optimizer.state)))
        self.shard.load(self.model, self.optimizer, state)

    def prepare_checkpoint(self, directory: Path, step: int) -> None:
        """Every rank, before its node's writer writes the checkpoint of ``step`` into
        ``directory``: a sharded run gathers the float32 weights and stages its slice."""
        if self.shard is None:
            return
        self._gathered = self.shard.master_weights(self.model)
        self._staged = zero_checkpoint.stage_slice(directory, step, self.shard.layout,
                                        dict(tree_flatten(self.optimizer.state)),
                                        self.place.group)

    def optimizer_state(self) -> dict[str, mx.array]:
        """What ``optimizer.safetensors`` holds: the state, or (sharded) its scalars."""
        state = super().optimizer_state()
        if self.shard is None:
            return state
        return {k: v for k, v in state.items() if not k.startswith(zero.FLAT + ".")}

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
        if self.shard is None:
            return None
        staged = self._staged
        return lambda directory: zero_checkpoint.place_staged(staged, directory)

    def close(self) -> None:
        self.prefetch.close()
