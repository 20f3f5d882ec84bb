"""Fine-tuning over pipeline stages, as a workload of the one run loop.

With ``train.stages`` (blocks per rank, in rank order) rank ``s`` is stage ``s``, as the
bundled trainer's pipeline (:mod:`mlxops.trainer.pipelinerun`, whose step it runs): it
reads from disk only its own blocks of the base model and the ends it holds
(:func:`.pipeline.load_stage`), makes trainable what the method trains of them
(:func:`.pipeline.apply_stage_method`, adapters from the run's seed by name), takes the
whole global batch every step in ``ceil(global_batch / micro_batch)`` micro-batches and
runs the 1F1B step (:class:`mlxops.trainer.pipelinerun.PipelineSteps`). The rest is the
loop's, with ``replicated = False``: no consistency check, every rank writes its own
checkpoint, ``ckpt/stage-<s>/``.

**The objective** is data-parallel fine-tuning's (:mod:`.objective`): the mean over every
unmasked token of the global batch. A micro-batch's loss on the last stage is the sum of
its tokens' losses times ``M / T`` (``M`` micro-batches, ``T`` the global batch's tokens),
and the step divides the sum over the micro-batches by ``M``:

    (1 / M) sum_m (M / T) sum_{tokens of m} loss  =  sum_{all tokens} loss / T

The step's statistics are one ``all_sum`` of ``[loss, 1, 0]``, the loss 0 on the stages
before the last, so every heartbeat and rank 0's metrics line carry the last stage's loss
exactly. The adapters' dropout is drawn per example (:mod:`.dropout`) from the same seeds
as a data-parallel run's.

**A checkpoint** holds the stage's trainable weights and their optimizer state under the
whole model's names (``model.layers.7.self_attn.q_proj.lora_a``), and the stage's part of
the adapters in mlx-lm's format (``adapters.safetensors`` under the same names,
``adapter_config.json`` of the whole run): ``mlxops fetch`` brings every stage's and
:func:`.pipeline.assemble` makes them one. A resume reads the same step's checkpoint of
every stage directory beside its own and takes the names it holds now, so a run goes on
over another split where those directories are on the node.

**Not here**: validation (``train.eval_every``, refused at load) and the out-of-memory
back-off (a stage cannot leave its neighbours' ``send`` / ``recv``; the split by memory is
the guard).

Node side: standard library, mlx, numpy and mlx-lm.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten, tree_map_with_path

from mlxops.trainer import pipeline
from mlxops.trainer.checkpoint import CKPT_MODEL, CKPT_OPTIMIZER
from mlxops.trainer.pipelinerun import PipelineSteps, gathered, missing
from mlxops.trainer.plansearch import cut

from . import dropout as ftdropout
from . import model as ftmodel
from . import pipeline as fp
from .config import ConfigError
from .data import micro_batches
from .objective import seed_of
from .workload import FinetuneWorkload


class PipelineFinetuneWorkload(FinetuneWorkload):
    """Stage ``rank`` of a fine-tuning (``train.stages``); see the module."""

    replicated = False

    def build_model(self) -> Any:
        """Only this stage's blocks and ends, read from disk alone, with its adapters."""
        from mlx_lm.tuner.trainer import grad_checkpoint
        from mlx_lm.utils import load_tokenizer

        cfg, p, stages = self.cfg, self.place, self.cfg.train.stages
        path = Path(cfg.model.path or "")
        if not (path / "config.json").is_file():
            raise ConfigError(f"{path}: model.path: no config.json (a Hugging Face / mlx-lm "
                              "model directory)")
        blocks = json.loads((path / "config.json").read_text()).get("num_hidden_layers")
        if sum(stages) != blocks:
            raise ConfigError(f"{path / 'config.json'}: train.stages: {stages} sums to "
                              f"{sum(stages)} blocks; the model has {blocks}")
        self.start = sum(stages[:p.rank])
        self.stop_block = self.start + stages[p.rank]
        self.first, self.last = p.rank == 0, p.rank == p.world - 1
        try:
            self.model, self.model_config, _ = fp.load_stage(
                path, self.start, self.stop_block, self.first, self.last)
        except fp.PipelineModelError as exc:
            raise ConfigError(str(exc)) from None
        m = cfg.method
        self.num_layers = blocks if m.num_layers == -1 else min(m.num_layers, blocks)
        self.adapted = fp.apply_stage_method(self.model, cfg, blocks, self.start,
                                             self.stop_block)
        fp.init_adapters(self.model, cfg.train.seed, self.start)
        self.row_seeds = ftdropout.install(self.model, m.dropout)
        if cfg.train.grad_checkpoint and self.model.model.layers:
            grad_checkpoint(self.model.model.layers[0])
        return load_tokenizer(path)

    def _global(self, name: str) -> str:
        return fp.to_global(name, self.start)

    def _local(self, name: str) -> str:
        return fp.to_local(name, self.start)

    # -- the batch: the whole global batch through every stage ------------------------------

    @property
    def pieces(self) -> int:
        return -(-self.cfg.train.global_batch // self.micro_cap)

    def _micro(self) -> int:
        return cut(self.cfg.train.global_batch, self.micro_cap)

    def resplit(self, counts: list[int]) -> None:
        self.counts = counts   # every stage takes the whole global batch, whatever it says

    def compile(self) -> None:
        t, p = self.cfg.train, self.place
        stage = fp.FinetuneStage(self.model, self.model_config, self.start, self.first,
                                 self.last, seeds=self.row_seeds)
        step = pipeline.PipelineStep(
            stage, p.group, p.rank, p.world,
            first_backward=fp.first_trained_stage(t.stages, self.num_layers))
        self.steps = PipelineSteps(self.model, self.optimizer, step, p.group,  # type: ignore[assignment]
                                   t.grad_clip, local=self._local)

    def batches(self, step: int) -> list[tuple[mx.array, ...]]:
        """The step's micro-batches of the whole global batch: tokens, lengths, the
        weight ``M / T`` and each row's dropout seed (see the module)."""
        seed = self.cfg.train.seed
        rows = self.cursor.global_rows(step)
        pieces = min(self.pieces, len(rows))
        weight = mx.array(pieces / max(1, self.cursor.step_tokens(step)), mx.float32)
        seeds = np.array([seed_of(seed, step, i) for i in range(len(rows))]
                         if self.cfg.method.dropout else [0] * len(rows), np.uint32)
        parts = np.array_split(seeds, pieces)
        return [(mx.array(x), mx.array(lengths), weight, mx.array(part))
                for (x, lengths), part in zip(
                    micro_batches(self.cursor.examples, rows, pieces,
                                  self.cfg.train.max_seq_len), parts, strict=True)]

    def start_line(self) -> str:
        p, t = self.place, self.cfg.train
        n = sum(v.size for _, v in tree_flatten(self.model.parameters()))
        return (f"start: pipeline stage {p.rank} of {p.world}: blocks {self.start}-"
                f"{self.stop_block - 1} ({self.adapted} adapted), {n:,} parameters held, "
                f"{self.trainable:,} trainable ({self.cfg.method.type}); micro "
                f"{self._micro()} x accum {self.pieces} = global {t.global_batch} through "
                f"every stage; {self.n_train} train examples, {self.total} steps")

    def check_validation(self) -> None:
        raise ConfigError("train.eval_every: validation across pipeline stages is not built "
                          "yet (docs/pipeline.md); set 0")

    def can_back_off(self) -> bool:
        return False   # a stage cannot leave its neighbours' send/recv (the module)

    def evaluate(self) -> float | None:
        return None

    # -- checkpoints by the whole model's names ---------------------------------------------

    def weights(self) -> dict[str, mx.array]:
        return {self._global(k): v for k, v in ftmodel.trainable_weights(self.model).items()}

    def optimizer_state(self) -> dict[str, mx.array]:
        return {self._global(k): v for k, v in tree_flatten(self.optimizer.state)}

    def _missing(self, path: Path, name: str) -> Exception:
        return missing(path, name, self.place.rank, self.start, self.stop_block)

    def load_weights(self, weights: dict[str, mx.array], path: Path) -> None:
        merged = gathered(path, CKPT_MODEL)
        held = ftmodel.trainable_weights(self.model)
        for name in held:
            if self._global(name) not in merged:
                raise self._missing(path, self._global(name))
        self.model.update(pipeline.shaped(self.model.trainable_parameters(),
                                          {k: merged[self._global(k)] for k in held}))

    def restore_optimizer(self, saved: dict[str, mx.array], path: Path) -> None:
        """This stage's optimizer state from every stage's checkpoint, by name."""
        merged = gathered(path, CKPT_OPTIMIZER)
        self.optimizer.init(self.model.trainable_parameters())
        for name, _ in tree_flatten(self.optimizer.state):
            if self._global(name) not in merged:
                raise self._missing(path, f"optimizer {self._global(name)}")
        self.optimizer.state = tree_map_with_path(lambda k, _: merged[self._global(k)],
                                                  self.optimizer.state)
