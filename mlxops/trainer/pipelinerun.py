"""The bundled trainer over pipeline stages, as a workload of the one run loop.

With ``train.stages`` (layers per rank, in rank order) rank ``s`` is stage ``s``: it
builds only its part of the model (:class:`~.stagemodel.StageModel`), takes the whole
global batch every step (the stages split layers, not the batch: each reads the same
micro-batches, the first stage their inputs, the last their targets) and runs the 1F1B
step of :mod:`.pipeline`. Everything else about a run is the loop's (:mod:`.loop`), with
what the loop does where ranks hold different state (``replicated = False``): no
consistency check, and every rank writes its own checkpoint, ``ckpt/stage-<s>/``, with
its weights and optimizer state under the whole model's names. A resume reads the same
step's checkpoint of every stage beside its own and takes the names it holds now, so a
run goes on over another split (fewer stages, other layers) where those directories are
on the node (one machine, a shared ``out``); elsewhere a name no file has is refused.

**The loss** is known on the last stage only. Every rank's step statistics are one
``all_sum`` of ``[loss, 1, 0]`` with the loss 0 on the stages before the last, so every
stage's heartbeat and rank 0's metrics line carry the last stage's loss exactly (adding
zeros), and the flag tells a stage that another failed, as in a data-parallel step.

**Out of memory** has no back-off across stages: a stage that fails in the middle of
the schedule leaves its neighbours in ``send`` / ``recv``, which no collective can join.
The split by memory (:mod:`.stages`) is the guard; a stage that still runs out of memory
ends the run (the loop's "cannot back off").

Node side: standard library, mlx and numpy only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from mlx.utils import tree_flatten, tree_map, tree_map_with_path

from . import pipeline, stages
from .bundled import TrainerWorkload, make_optimizer
from .checkpoint import CKPT_MODEL, CKPT_OPTIMIZER
from .data import Batches, split_rank
from .errors import TrainerError
from .loop import GB, Log
from .stagemodel import StageModel, TrainerStage


def gathered(path: Path, filename: str) -> dict[str, mx.array]:
    """``filename`` of the same step's checkpoint of every stage whose directory is
    beside this one (``ckpt/stage-*/step-<n>/``), merged by name: the layers a stage
    holds now may have been another stage's when the checkpoint was written."""
    merged: dict[str, mx.array] = {}
    for stage_dir in sorted(path.parent.parent.glob("stage-*")):
        if (stage_dir / path.name / filename).is_file():
            merged.update(mx.load(str(stage_dir / path.name / filename)))
    return merged


def missing(path: Path, name: str, stage: int, start: int, stop: int) -> TrainerError:
    """A name stage ``stage`` (layers ``[start, stop)``) holds that no checkpoint has."""
    return TrainerError(
        f"{path.parent.parent}: no stage's checkpoint {path.name} holds {name}, which "
        f"stage {stage} (layers {start}-{stop - 1}) holds now: a resume on another split "
        "reads every stage's ckpt/stage-*/ on this node (docs/pipeline.md)")


class PipelineSteps:
    """A stage's step with :class:`~.step.Steps`' interface (``run``, ``abstain``,
    ``snapshot``, ``restore``, ``state``), the loop's only way into a step."""

    def __init__(self, model: nn.Module, optimizer: optim.Optimizer, step: pipeline.PipelineStep,
                 group: mx.distributed.Group, grad_clip: float,
                 local: Callable[[str], str] | None = None):
        self.model, self.optimizer, self.step, self.group = model, optimizer, step, group
        self.grad_clip = grad_clip
        #: A gradient's name in ``model`` from its name in the whole model, where they
        #: differ (a fine-tuning stage numbers its blocks from 0); None: the same.
        self.local = local
        self.state = [model.state, optimizer.state]

    def _stats(self, loss: mx.array, flag: float, stuck: float) -> mx.array:
        vec = mx.stack([loss.astype(mx.float32), mx.array(flag), mx.array(stuck)])
        n = self.group.size()
        if n == 1:
            return vec
        total = mx.distributed.all_sum(vec, group=self.group, stream=mx.cpu)
        return mx.stack([total[0], total[1] / n, total[2]])

    def run(self, batches: list[tuple[mx.array, ...]], divisor: float, timed: bool
            ) -> tuple[mx.array, float | None]:
        """The step's gradients by 1F1B (they are means over the micro-batches already:
        ``divisor`` is not used), the loss to every stage, clipping, the update."""
        t0 = time.perf_counter()
        loss, grads = self.step.gradients(batches)
        compute = time.perf_counter() - t0
        stats = self._stats(loss if loss is not None else mx.array(0.0), 1.0, 0.0)
        if self.grad_clip > 0:
            grads = self.step.clip(grads, self.grad_clip)
        if self.local is not None:
            grads = {self.local(k): g for k, g in grads.items()}
        pipeline.update(self.model, self.optimizer, grads)
        mx.eval(stats, self.model.parameters(), self.optimizer.state)
        return stats, compute

    def abstain(self, stuck: bool = False) -> mx.array:
        return self._stats(mx.array(0.0), 0.0, 1.0 if stuck else 0.0)

    def snapshot(self) -> tuple[dict, dict]:
        return self.model.parameters(), tree_map(lambda a: a, self.optimizer.state)

    def restore(self, snap: tuple[dict, dict]) -> None:
        params, opt = snap
        self.model.update(params)
        self.optimizer.state = opt


class PipelineTrainerWorkload(TrainerWorkload):
    """Stage ``rank`` of the bundled trainer (``train.stages``); see the module."""

    replicated = False

    def check_world(self, world: int) -> None:
        super().check_world(world)   # config.check_world: one rank per stage

    def build_model(self, log: Log) -> None:
        """Only this stage's part of the model, and its optimizer."""
        cfg, t, p = self.cfg, self.cfg.train, self.place
        self.first_layer = sum(t.stages[:p.rank])
        self.end_layer = self.first_layer + t.stages[p.rank]
        self.model = StageModel(cfg.model, self.first_layer, self.end_layer, p.rank == 0,
                                p.rank == p.world - 1, t.seed, t.grad_checkpoint)
        self.optimizer = make_optimizer(cfg)
        self.shard = None  # a stage's optimizer state is its own layers' already
        self.optimizer.init(self.model.trainable_parameters())
        self.evaluator = None

    def resplit(self, counts: list[int]) -> None:
        """Every stage takes the whole global batch, whatever ``counts`` says."""
        g = self.cfg.train.global_batch
        self.counts = counts
        self.batch_plan = Batches(self.source, g, 0, 1, [g])
        self.micro, self.accum = split_rank(g, self.micro_cap)
        if self.steps is not None:
            self.compile()

    def compile(self) -> None:
        t, p, m = self.cfg.train, self.place, self.cfg.model
        step = pipeline.PipelineStep(TrainerStage(self.model, m.dims, self.dtype), p.group,
                                     p.rank, p.world,
                                     tied=pipeline.TIED if m.tie_embeddings else None)
        self.steps = PipelineSteps(self.model, self.optimizer, step, p.group,  # type: ignore[assignment]
                                   t.grad_clip)

    def start_line(self) -> str:
        p, t = self.place, self.cfg.train
        n = sum(v.size for _, v in tree_flatten(self.model.parameters()))
        return (f"start: pipeline stage {p.rank} of {p.world}: layers {self.first_layer}-"
                f"{self.end_layer - 1}, {n:,} parameters; micro {self.micro} x accum "
                f"{self.accum} "
                f"= global {t.global_batch} through every stage; memory plan "
                f"{self._planned() / GB:.2f} GB on this stage")

    def check_validation(self) -> None:
        raise TrainerError("train.eval_every: validation across pipeline stages is not built "
                           "yet")

    def can_back_off(self) -> bool:
        return False   # see the module: a stage cannot leave its neighbours' send/recv

    def evaluate(self) -> float | None:
        return None

    def _planned(self) -> int:
        """This stage's planned peak (:func:`.stages.stage_peak`)."""
        costs = stages.trainer_costs(self.cfg, self.micro, self.accum)
        p = self.place
        return stages.stage_peak(costs, self.first_layer, self.end_layer, p.rank, p.world,
                                 self.accum)[0]

    # -- resume, on this split or another -------------------------------------------------

    def _missing(self, path: Path, name: str) -> TrainerError:
        return missing(path, name, self.place.rank, self.first_layer, self.end_layer)

    def load_weights(self, weights: dict[str, mx.array], path: Path) -> None:
        merged = gathered(path, CKPT_MODEL)
        held = dict(tree_flatten(self.model.parameters()))
        for name in held:
            if name not in merged:
                raise self._missing(path, name)
        self.model.update(pipeline.shaped(self.model.parameters(),
                                          {k: merged[k] for k in held}))

    def restore_state(self, state: dict[str, Any], path: Path, log: Log) -> None:
        """The trainer's checks, then the optimizer's state of this stage's parameters
        from every stage's checkpoint (the loop restored only this stage's own file)."""
        super().restore_state(state, path, log)
        saved = gathered(path, CKPT_OPTIMIZER)
        wanted = dict(tree_flatten(self.optimizer.state))
        for name in wanted:
            if name not in saved:
                raise self._missing(path, f"optimizer {name}")
        self.optimizer.state = tree_map_with_path(lambda p, _: saved[p],
                                                  self.optimizer.state)
