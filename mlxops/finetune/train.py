"""The fine-tuning loop: mlx-lm's model and loss, the bundled trainer's step and machinery.

A step: this rank's slice of the global batch (:mod:`.data`), in ``accumulation``
micro-batches, through :class:`mlxops.trainer.step.Steps` with mlx-lm's ``default_loss``
(one compiled function, the all-reduce inside, when the slice is one micro-batch). Each
micro-batch's loss is the sum of its tokens' losses times ``world / T``, ``T`` the tokens
of the whole global batch (every rank knows it: the batch is a function of the step), so
the mean over ranks is the mean over every token of the global batch: the world size,
``balance`` and the accumulation change only the order of summation (and a rank's
weight in the mean needs no separate scale). The rest is the trainer's: the out-of-memory
back-off (every rank undoes the step and doubles its accumulation), the consistency check
(over the trainable parameters and the optimizer state), ``balance: auto``'s calibration,
heartbeats, ``metrics.jsonl`` lines and atomic checkpoints.

Exact resume: a checkpoint holds the trainable weights, the optimizer state, the step,
the data cursor and the best validation loss; the adapters' dropout draws no RNG state: an
example's mask is a function of ``(train.seed, step, its place in the global batch)``
(:mod:`.dropout`), so it needs no more than the step, and a resume on another world size
or split (``resume --exclude``) drops the same elements: only the order of summation
changes, which the tests hold to float tolerance.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from mlxops.node import protocol
from mlxops.node.protocol.calibration import Calibration
from mlxops.node.protocol.metrics import MetricsLine
from mlxops.trainer import balance, checkpoint, consistency, hooks
from mlxops.trainer.checkpoint import write_atomic
from mlxops.trainer.cursor import DataCursor
from mlxops.trainer.distributed import (
    all_gather_cpu,
    expected_world_size,
    host_names,
    init_group,
    is_node_writer,
)
from mlxops.trainer.resume import (
    agreed_checkpoint,
    load_compatible,
    restore_optimizer,
    truncate_metrics,
)
from mlxops.trainer.startbeat import StartBeat
from mlxops.trainer.step import WIRE_DTYPES, Steps
from mlxops.trainer.train import CALIBRATION_STEPS, GB, TrainerError, is_oom
from mlxops.trainer.validation import Validation, ValidationState, perplexity

from . import dropout as ftdropout
from . import model as ftmodel
from .config import FinetuneConfig, check_world, diff_resume_keys
from .data import Cursor, Examples, length_batches, load_examples, micro_batches
from .evaluate import validation_loss
from .objective import make_optimizer, seed_of, token_loss


class FineTuner:
    def __init__(self, cfg: FinetuneConfig, resume: bool):
        self.cfg, self.out = cfg, Path(cfg.out)
        self.group = init_group(expected_world_size())
        self.rank, self.world = self.group.rank(), self.group.size()
        # Alive while it loads the base model and compiles (trainer/startbeat.py).
        self._starting = StartBeat(self._starting_beat).start()
        check_world(cfg, self.world)
        self.writer = is_node_writer(self.group)
        t = cfg.train
        mx.random.seed(t.seed)  # the adapters' initialisation draws from it
        self.model, tokenizer = ftmodel.load_base(cfg)
        ftmodel.apply_method(self.model, cfg)
        row_seeds = ftdropout.install(self.model, cfg.method.dropout)
        blocks = len(self.model.layers)
        self.num_layers = blocks if cfg.method.num_layers == -1 else cfg.method.num_layers
        self.trainable = ftmodel.count_trainable(self.model)
        train, valid, dropped = load_examples(cfg, tokenizer)
        if dropped:
            self._log(f"data: {dropped} examples left out: every target token is masked "
                      f"(prompt masking, max_seq_len {t.max_seq_len})")
        self.cursor = Cursor(train, t.global_batch, t.seed, t.max_seq_len)
        self.valid = valid
        batches = length_batches(valid, t.global_batch)
        self.val_batches = batches if t.eval_batches == -1 else batches[:t.eval_batches]
        self.total = t.epochs * self.cursor.per_epoch if t.epochs else t.steps
        self.stop = min(t.stop_at or self.total, self.total)
        self.optimizer = make_optimizer(cfg, self.total)
        self.model.train()
        self.optimizer.init(self.model.trainable_parameters())
        mx.eval(self.model.parameters(), self.optimizer.state)
        self.pieces = t.accumulation  # doubled by an out-of-memory back-off
        self.balance = balance.Balance.of(t.balance)
        self.counts = self.balance.split(t.global_batch, self.world)
        self.speeds: list[float] | None = None
        self.speed_hosts: list[str] | None = None
        self.validation = Validation(t.patience)
        self.step, self.repairs = 0, 0
        self._beat_at: float | None = None
        self._last: tuple[float | None, float] = (None, 0.0)
        self._oom_error = ""
        self._start(resume, len(train), len(valid))
        self._calibration: list[float] | None = None
        if self.balance.measures and self.world > 1 and self.speeds is None:
            self._calibration = []
        self.steps = Steps(self.model, self.optimizer, self.group, mx.float32,
                           cfg.optimizer.grad_clip, WIRE_DTYPES[t.grad_reduce_dtype],
                           loss=ftdropout.seeded(token_loss, row_seeds))

    # -- start / resume ------------------------------------------------------------------

    def _start(self, resume: bool, n_train: int, n_valid: int) -> None:
        latest = agreed_checkpoint(self.cfg.out, self.group, resume)
        if not resume:
            total = ftmodel.count_all(self.model)
            self._log(f"start: {self.trainable:,} trainable of {total:,} parameters "
                      f"({self.cfg.method.type}), world {self.world}, split {self.counts} = "
                      f"global {self.cfg.train.global_batch}; {n_train} train / {n_valid} "
                      f"valid examples, {self.cursor.per_epoch} steps per epoch, "
                      f"{self.total} steps")
            return
        if latest is None:
            self._log("resume: no checkpoint yet, starting at step 0")
            return
        weights, opt, state = load_compatible(
            latest, lambda saved: diff_resume_keys(saved, self.cfg))
        unknown = set(weights) - set(ftmodel.trainable_weights(self.model))
        if unknown:
            raise TrainerError(f"{latest}: weights the model does not train: "
                               f"{sorted(unknown)[:3]}")
        self.model.load_weights(list(weights.items()), strict=False)
        restore_optimizer(self.optimizer, opt, self.model.trainable_parameters())
        mx.eval(self.model.parameters(), self.optimizer.state)
        self.step, self.repairs = state["step"], state.get("consistency_repairs", 0)
        self.validation.state = ValidationState.from_dict(state["validation"])
        expected = self.cursor.position(self.step)
        if DataCursor.from_dict(state["data_position"]) != expected:
            raise TrainerError(f"{latest}: data cursor {state['data_position']} does not "
                               f"match step {self.step} ({expected.to_dict()})")
        if self.balance.measures and state.get("balance_speeds"):
            speeds = balance.recorded_speeds(host_names(self.group),
                                             state.get("balance_hosts") or [],
                                             state["balance_speeds"])
            if speeds is not None:
                self.speeds, self.speed_hosts = speeds, host_names(self.group)
                self.counts = self.balance.split(self.cfg.train.global_batch, self.world,
                                                 speeds)
        if self.rank == 0:
            truncate_metrics(self.out, self.step)
        self._log(f"resume: step {self.step} from {latest} (saved with world "
                  f"{state.get('world_size')}; now world {self.world}, split {self.counts})")

    # -- one step ------------------------------------------------------------------------

    def _pieces(self, step: int, examples: Examples, rows: np.ndarray, first: int
                ) -> list[tuple[mx.array, mx.array, mx.array]]:
        """This rank's micro-batches of ``rows`` (``first``: the place of ``rows[0]`` in
        the global batch): tokens, lengths and each row's dropout seed."""
        seed = self.cfg.train.seed
        places = range(first, first + len(rows))
        # The seeds are only read with dropout; zeros spare the hashing otherwise.
        seeds = np.array([seed_of(seed, step, i) for i in places] if self.cfg.method.dropout
                         else [0] * len(rows), np.uint32)
        parts = np.array_split(seeds, min(self.pieces, len(rows)))
        return [(mx.array(x), mx.array(lengths), mx.array(part))
                for (x, lengths), part in zip(
                    micro_batches(examples, rows, self.pieces, self.cfg.train.max_seq_len),
                    parts, strict=True)]

    def _run_step(self, step: int, timed: bool) -> tuple[mx.array, float | None]:
        """Compute, all-reduce and update: (stats, seconds at which compute ended or None)."""
        steps, t0 = self.steps, time.perf_counter()
        weight = mx.array(self.world / max(1, self.cursor.step_tokens(step)), mx.float32)
        try:
            if hooks.fake_oom(self.rank, step):
                raise MemoryError("[malloc] simulated allocation failure (test hook)")
            rows = self.cursor.rank_rows(step, self.counts, self.rank)
            batches = self._pieces(step, self.cursor.examples, rows,
                                   sum(self.counts[:self.rank]))
            hooks.fake_slow(self.rank, self.counts[self.rank])
            compute = None
            if len(batches) == 1:
                (x, lengths, seeds), = batches
                stats, local = steps.fused(x, lengths, weight, seeds)
                if timed:
                    mx.eval(local)
                    compute = time.perf_counter() - t0
                del local
            else:
                loss_sum, acc = None, None
                for x, lengths, seeds in batches:
                    if acc is None:
                        loss_sum, acc = steps.first(x, lengths, weight, seeds)
                    else:
                        loss_sum, acc = steps.next(x, lengths, weight, seeds, loss_sum, acc)
                    mx.eval(loss_sum, acc)
                compute = time.perf_counter() - t0
                # Each micro-batch's loss is already its share of the global mean.
                stats = steps.apply(loss_sum, acc, mx.array(1.0))
                del acc
            mx.eval(stats, steps.state)
            return stats, compute
        except (RuntimeError, MemoryError) as e:
            if not is_oom(e):
                raise
            self._oom_error = str(e).splitlines()[0]
        stats = steps.abstain(stuck=self.pieces >= self.counts[self.rank])
        mx.eval(stats)
        return stats, None

    def _backoff(self, step: int, stuck: bool) -> None:
        if stuck:
            raise TrainerError(f"out of memory at step {step} with one example per "
                               "micro-batch" + (f": {self._oom_error}" if self._oom_error
                                                else " on another rank"))
        old = self.pieces
        self.pieces = min(self.pieces * 2, self.counts[self.rank])
        self._log(f"out of memory at step {step} on some rank; accumulation {old} -> "
                  f"{self.pieces}, same global batch, redoing step {step}")
        mx.clear_cache()

    # -- validation ----------------------------------------------------------------------

    def validate(self) -> float | None:
        return validation_loss(self.model, self.valid, self.val_batches, self.counts,
                               self.rank, self.pieces, self.cfg.train.max_seq_len, self.group)

    # -- main loop -----------------------------------------------------------------------

    def run(self) -> None:
        t = self.cfg.train
        window: list[tuple[float, float | None, int]] = []
        self.out.mkdir(parents=True, exist_ok=True)
        while self.step < self.stop:
            step = self.step + 1
            logged = step % t.log_every == 0 or step == self.stop
            before = self.steps.snapshot()
            t0 = time.perf_counter()
            stats, compute = self._run_step(step, logged or self._calibration is not None)
            elapsed = time.perf_counter() - t0
            loss, flag, stuck = stats.tolist()
            del stats
            if flag < 1.0:  # some rank ran out of memory: every rank undoes the step
                self.steps.restore(before)
                self._backoff(step, stuck > 0)
                continue
            del before
            self.step, self._oom_error = step, ""
            tokens = self.cursor.step_tokens(step)
            window.append((elapsed, compute, tokens))
            self._starting.stop()  # the loop's own heartbeat from its first step
            self._progress(loss, tokens / elapsed, protocol.RUNNING)
            if t.consistency_every and self.world > 1 and step % t.consistency_every == 0:
                self._check_consistency(step)
            val = None
            if t.eval_every and (step % t.eval_every == 0 or step == self.stop):
                val = self.validate()
                if val is not None and self.validation.observe(step, val).improved:
                    self._checkpoint(self.out / protocol.BEST_DIR, keep=1)
            if logged or val is not None:
                self._metrics(loss, window, val)
                window = []
            if self._calibration is not None:
                self._calibrate(compute)
            patience = val is not None and self.validation.exhausted
            if step == self.stop or patience or (t.save_every and step % t.save_every == 0):
                self._checkpoint(self.out / protocol.CKPT_DIR, keep=t.keep)
            hooks.hold(step, lambda: self._progress(*self._last, protocol.RUNNING))
            if patience:
                best = self.validation.state
                self._log(f"patience: {best.stale} validations without a loss below "
                          f"{best.best_loss:.4f} (step {best.best_step}); stopping at step "
                          f"{step}")
                break
        self._starting.stop()  # a resume at or past its last step makes none
        self._progress(self._last[0], self._last[1], protocol.FINISHED)
        best = self.validation.state
        self._log(f"done: {self.step} steps; best validation loss "
                  + (f"{best.best_loss:.4f} at step {best.best_step}"
                     if best.best_loss is not None else "none"))

    def _calibrate(self, compute: float | None) -> None:
        """``balance: auto``: the trainer's rule (a step to compile, then the fastest of
        CALIBRATION_STEPS), in examples per second, gathered; then the split by them."""
        assert self._calibration is not None and compute is not None
        self._calibration.append(compute)
        if len(self._calibration) < 1 + CALIBRATION_STEPS:
            return
        local = self.counts[self.rank] / min(self._calibration[1:])
        self._calibration = None
        speeds = all_gather_cpu(mx.array([local], dtype=mx.float32), self.group).tolist()
        self.speeds, self.speed_hosts = speeds, host_names(self.group)
        before = self.counts
        self.counts = self.balance.split(self.cfg.train.global_batch, self.world, speeds)
        self._log(f"balance: auto: examples/s per rank {[round(s, 1) for s in speeds]}: "
                  f"split {before} -> {self.counts}")
        if self.writer:
            write_atomic(self.out / protocol.CALIBRATION, Calibration(
                step=self.step, world_size=self.world, hosts=self.speed_hosts,
                samples_per_sec=speeds, batch_split=self.counts, time=time.time()).to_json())

    def _check_consistency(self, step: int) -> None:
        items = consistency.state_items(self.model, self.optimizer, trainable_only=True)
        mismatch = consistency.compare(items, self.group)
        if mismatch is None:
            return
        consistency.repair(self.model, self.optimizer, self.group, trainable_only=True)
        self.repairs += 1
        self._log(f"consistency: step {step}: {mismatch.describe()}; rank 0's trainable "
                  f"weights and optimizer state sent to every rank (repair {self.repairs})")

    def _starting_beat(self) -> None:
        """The heartbeat before the first step: no step of this run yet (``step`` None)."""
        path = self.out / protocol.progress_file(self.rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(protocol.Progress(
            rank=self.rank, step=None, time=time.time(), pid=os.getpid(),
            world_size=self.world, state=protocol.STARTING).to_dict()) + "\n", durable=False)

    def _progress(self, loss: float | None, tps: float, state: str) -> None:
        self._last = (loss, tps)
        now = time.monotonic()
        if state == protocol.RUNNING and self._beat_at is not None and \
                now - self._beat_at < protocol.HEARTBEAT_EVERY:
            return
        self._beat_at = now
        path = self.out / protocol.progress_file(self.rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(protocol.Progress(
            rank=self.rank, step=self.step, loss=loss, time=time.time(), pid=os.getpid(),
            world_size=self.world, tokens_per_sec=tps, state=state).to_dict()) + "\n",
            durable=False)

    def _metrics(self, loss: float, window: list, val: float | None) -> None:
        if self.rank != 0:
            return
        step_time = sum(w[0] for w in window) / len(window)
        split = [w for w in window if w[1] is not None]
        share = sum(w[1] for w in split) / sum(w[0] for w in split) if split else 1.0
        tps = sum(w[2] for w in window) / sum(w[0] for w in window)
        rows = self.counts[self.rank]
        rec = MetricsLine(
            step=self.step, loss=loss, tokens_per_sec=tps, time=time.time(),
            step_time=step_time, compute_time=step_time * share,
            comm_time=step_time * (1 - share), world_size=self.world,
            micro_batch=-(-rows // self.pieces), accumulation=min(self.pieces, rows),
            lr=self.optimizer.learning_rate.item(), active_memory=mx.get_active_memory(),
            peak_memory=mx.get_peak_memory(), consistency_repairs=self.repairs,
            batch_split=self.counts, val_loss=val,
            val_perplexity=None if val is None else perplexity(val),
            trainable_params=self.trainable)
        with open(self.out / protocol.METRICS, "a") as f:
            f.write(rec.line())
        shown = f" | val {val:.4f}" if val is not None else ""
        print(f"step {self.step} | loss {loss:.4f}{shown} | {tps:.0f} tok/s | "
              f"{step_time * 1e3:.1f} ms/step | peak mem {rec.peak_memory / GB:.2f} GB",
              flush=True)

    def _checkpoint(self, directory: Path, keep: int) -> None:
        """A checkpoint in ``directory`` (``ckpt/`` or ``best/``), with its adapters."""
        if not self.writer:
            return
        state: dict[str, Any] = {
            "step": self.step, "data_cursor": self.step,
            "data_position": self.cursor.position(self.step).to_dict(),
            "rng": {"seed": self.cfg.train.seed, "rule": "dropout per example from "
                    "(train.seed, step, place in the global batch)"},
            "world_size": self.world, "accumulation": self.pieces,
            "consistency_repairs": self.repairs, "batch_split": self.counts,
            "balance_speeds": self.speeds, "balance_hosts": self.speed_hosts,
            "validation": self.validation.state.to_dict(), "trainable": self.trainable,
            "config": self.cfg.to_dict(), "time": time.time(), "mlx_version": mx.__version__,
        }
        config = ftmodel.adapter_config(self.cfg, self.num_layers)

        def adapters(tmp: Path) -> None:
            ftmodel.write_adapters(tmp, tmp / protocol.CKPT_MODEL, config)

        path = checkpoint.save(directory, self.step, ftmodel.trainable_weights(self.model),
                               dict(tree_flatten(self.optimizer.state)), state, keep,
                               extra=adapters)
        if self.rank == 0:
            print(f"checkpoint: {path}", flush=True)

    def _log(self, msg: str) -> None:
        if self.rank == 0:
            print(msg, flush=True)


def finetune(cfg: FinetuneConfig, resume: bool = False) -> None:
    FineTuner(cfg, resume).run()
