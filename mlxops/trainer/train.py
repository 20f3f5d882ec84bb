"""The training loop: compiled data-parallel steps, checkpoints, metrics, OOM back-off.

Longer than 400 lines because the loop is meant to read top to bottom in one place (as
nanoGPT's does): the step, its metrics line, checkpoints and the back-off are its parts.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.optimizers as optim
from mlx.utils import tree_flatten

from mlxops.node import protocol
from mlxops.node.protocol.calibration import Calibration
from mlxops.node.protocol.layout import BEST_DIR
from mlxops.node.protocol.metrics import MetricsLine

from . import balance, checkpoint, consistency, hooks, plan
from .checkpoint import write_atomic
from .config import TrainerConfig, check_world, diff_resume_keys
from .cursor import DataCursor
from .data import Batches, make_source, split_rank
from .distributed import (
    all_gather_cpu,
    expected_world_size,
    host_names,
    init_group,
    is_node_writer,
)
from .evaluate import Evaluator
from .model import Transformer, count_params
from .prefetch import Prefetcher
from .resume import agreed_checkpoint, load_compatible, restore_optimizer, truncate_metrics
from .startbeat import StartBeat
from .step import WIRE_DTYPES, Steps
from .validation import Validation, ValidationState, perplexity

GB = 1024**3
#: balance: auto times this many steps (after one for compilation) before it splits.
CALIBRATION_STEPS = 3


def _rounded(values: list[float]) -> list[float]:
    return [round(v, 1) for v in values]


class TrainerError(RuntimeError):
    """A failure during training that deserves one line, not a traceback. Exit code 1."""


def _is_oom(e: BaseException) -> bool:
    text = str(e).lower()
    return isinstance(e, MemoryError) or ("alloc" in text or "out of memory" in text)


def make_optimizer(cfg: TrainerConfig) -> optim.Optimizer:
    t = cfg.train
    decay = optim.cosine_decay(t.lr, max(1, t.steps - t.warmup), end=t.min_lr)
    if t.warmup:
        lr = optim.join_schedules([optim.linear_schedule(0.0, t.lr, t.warmup), decay],
                                  [t.warmup])
    else:
        lr = decay
    return optim.AdamW(learning_rate=lr, weight_decay=t.weight_decay)


class Trainer:
    def __init__(self, cfg: TrainerConfig, resume: bool):
        self.cfg = cfg
        self.out = Path(cfg.out)
        self.group = init_group(expected_world_size())
        self.rank, self.world = self.group.rank(), self.group.size()
        self._beat_at: float | None = None  # when the heartbeat was last written
        self._clock = time.monotonic  # what the heartbeat's interval is measured with
        # Alive while it loads and compiles (trainer/startbeat.py), until its first step.
        self._starting = StartBeat(self._starting_beat).start()
        check_world(cfg, self.world)  # mlxops launch checked it too, with the job's hosts
        self.writer = is_node_writer(self.group)
        t = cfg.train
        self.source = make_source(cfg.data, cfg.model.vocab_size, cfg.model.seq_len)
        # The rows of the next steps, read while this one computes (trainer/prefetch.py).
        self.prefetch = Prefetcher(self.source.samples, lambda s: self.batches.plan(s),
                                   cfg.data.prefetch)
        self.validation = Validation(t.patience)
        if t.eval_every:
            self.source.validation(0, 1)  # a corpus without a validation split: refused now
        self.micro_cap = t.micro_batch  # halved by an out-of-memory back-off
        self.steps: Steps | None = None
        # balance: auto measures each rank's speed in its first steps (trainer/balance.py);
        # until then, and with equal, every rank takes as many sequences as it can equally.
        self.speeds: list[float] | None = None
        self.speed_hosts: list[str] | None = None  # the host of each rank speeds are for
        self.balance = balance.Balance.of(t.balance)
        self._split(self.balance.split(t.global_batch, self.world))
        self.dtype = mx.bfloat16 if t.dtype == "bfloat16" else mx.float32

        mx.random.seed(t.seed)
        self.model = Transformer(cfg.model, grad_checkpoint=t.grad_checkpoint)
        self.optimizer = make_optimizer(cfg)
        self.optimizer.init(self.model.trainable_parameters())
        self.evaluator = Evaluator(self.model)
        # The trainer's own RNG key, saved and restored exactly (MLX's global key cannot be
        # set back); training itself draws no random numbers (no dropout).
        self.key = mx.random.key(t.seed)
        mx.eval(self.model.parameters(), self.optimizer.state)
        self.step = 0
        self._oom_error = ""
        self.repairs = 0  # consistency repairs in this run (resume carries them on)
        # What the last progress record said; a resume at or past the final step has none.
        self._last_loss: float | None = None
        self._last_tps = 0.0
        self._last_val: float | None = None   # the last evaluation's loss
        self._start(resume)
        self._calibration: list[float] | None = None
        if self.balance.measures and self.world > 1 and self.speeds is None:
            self._calibration = []  # compute seconds per step, measured from the 2nd step
        self._compile()

    def _split(self, counts: list[int]) -> None:
        """Take ``counts[r]`` sequences of every global batch on rank r from now on."""
        self.counts = counts
        self.batches = Batches(self.source, self.cfg.train.global_batch, self.rank,
                               self.world, counts)
        self.micro, self.accum = split_rank(counts[self.rank], self.micro_cap)
        if self.steps is not None:
            self._compile()  # this rank's weight in the mean changed with its share

    def _compile(self) -> None:
        t = self.cfg.train
        self.steps = Steps(self.model, self.optimizer, self.group, self.dtype, t.grad_clip,
                           WIRE_DTYPES[t.grad_reduce_dtype],
                           balance.scale(self.counts, self.rank))

    # -- start / resume ------------------------------------------------------------------

    def _start(self, resume: bool) -> None:
        # Every rank reads its own node's copy; all must agree on the step.
        latest = agreed_checkpoint(self.cfg.out, self.group, resume)
        if not resume:
            if len(set(self.counts)) == 1:
                batch = f"micro {self.micro} x accum {self.accum} x world {self.world}"
            else:
                batch = f"split {self.counts} (rank 0: micro {self.micro} x accum {self.accum})"
            self._log(f"start: {count_params(self.model):,} parameters, world {self.world}, "
                      f"{batch} = global {self.cfg.train.global_batch}; memory plan "
                      f"{self._planned() / GB:.2f} GB per rank")
            return
        if latest is None:
            self._log("resume: no checkpoint yet, starting at step 0")
            return
        weights, opt, state = load_compatible(
            latest, lambda saved: diff_resume_keys(saved, self.cfg))
        self.model.load_weights(list(weights.items()), strict=True)
        restore_optimizer(self.optimizer, opt, self.model.trainable_parameters())
        self.key = mx.array(state["rng_key"], dtype=mx.uint32)
        self.step = state["step"]
        self.repairs = state.get("consistency_repairs", 0)
        if self.balance.measures and state.get("balance_speeds"):
            self._recorded_speeds(state)
        if state["data_cursor"] != self.batches.cursor(self.step):
            raise TrainerError(f"{latest}: data cursor {state['data_cursor']} does not match "
                               f"step {self.step}")
        saved_at = state.get("data_position")
        now_at = self.source.cursor(self.batches.cursor(self.step))
        if saved_at is not None and now_at is not None and \
                DataCursor.from_dict(saved_at) != now_at:
            raise TrainerError(f"{latest}: the data cursor {saved_at} is not where step "
                               f"{self.step} reads now ({now_at.to_dict()}): the corpus "
                               "changed since the checkpoint")
        if state.get("validation"):
            self.validation.state = ValidationState.from_dict(state["validation"])
        mx.eval(self.model.parameters(), self.optimizer.state)
        if self.rank == 0:
            truncate_metrics(self.out, self.step)
        was = state.get("world_size")
        self._log(f"resume: step {self.step} from {latest} (saved with world {was}; now world "
                  f"{self.world}, micro {self.micro} x accum {self.accum})")
        if state["config"]["train"]["steps"] != self.cfg.train.steps:
            self._log("note: train.steps changed; the learning-rate schedule follows the new "
                      "value from here on")

    def _recorded_speeds(self, state: dict[str, Any]) -> None:
        """balance: auto on resume: the last calibration the checkpoint recorded, where it
        still applies (the same hosts with as many ranks each; another world size after an
        ``--exclude`` keeps the remaining hosts' speeds); else the ranks measure again."""
        measured = state["balance_speeds"]
        # Checkpoints before the hosts were recorded: only the very same world applies.
        hosts = host_names(self.group)  # every rank takes this branch: same checkpoint
        measured_hosts = state.get("balance_hosts") or (
            hosts if len(measured) == self.world else [])
        speeds = balance.recorded_speeds(hosts, measured_hosts, measured)
        if speeds is None:
            self._log(f"balance: auto: the speeds recorded (hosts {measured_hosts}) do not "
                      f"fit the ranks now (hosts {hosts}); measuring again")
            return
        self.speeds, self.speed_hosts = speeds, hosts
        self._split(self.balance.split(self.cfg.train.global_batch, self.world, speeds))
        self._log(f"balance: auto: the speeds measured before (samples/s per rank "
                  f"{_rounded(speeds)}): split {self.counts}")

    # -- one step ------------------------------------------------------------------------

    def _run_step(self, step: int, timed: bool) -> tuple[mx.array, float | None]:
        """Compute, all-reduce and update: (stats, seconds at which compute ended or None).

        One host wait per step (the final ``mx.eval``), plus one per micro-batch when
        accumulating; ``timed`` (a logged step) waits once more between the gradients
        and the all-reduce of a fused step to measure the split.
        """
        steps, t0 = self.steps, time.perf_counter()
        try:
            if hooks.fake_oom(self.rank, step):
                raise MemoryError("[malloc] simulated allocation failure (test hook)")
            batches = self.batches.micro_batches(step, self.micro, self.prefetch.rows(step))
            hooks.fake_slow(self.rank, self.counts[self.rank])
            if self.accum == 1:
                (x, y), = batches
                stats, local = steps.fused(mx.array(x), mx.array(y))
                compute = None
                if timed:
                    mx.eval(local)
                    compute = time.perf_counter() - t0
                del local
            else:
                loss_sum, acc = None, None
                for x, y in batches:
                    x, y = mx.array(x), mx.array(y)
                    if acc is None:
                        loss_sum, acc = steps.first(x, y)
                    else:
                        loss_sum, acc = steps.next(x, y, loss_sum, acc)
                    mx.eval(loss_sum, acc)
                compute = time.perf_counter() - t0
                stats = steps.apply(loss_sum, acc, mx.array(float(self.accum)))
                del acc
            mx.eval(stats, steps.state)
            return stats, compute
        except (RuntimeError, MemoryError) as e:
            if not _is_oom(e):
                raise
            self._oom_error = str(e).splitlines()[0]
        # Out of memory before this rank's collectives: join them with nothing, so that
        # its peers do not wait forever and all of them see the flag and undo the step.
        stats = steps.abstain(stuck=self.micro == 1)
        mx.eval(stats)
        return stats, None

    def _backoff(self, step: int, stuck: bool) -> None:
        if stuck:
            raise TrainerError(f"out of memory at step {step} with micro_batch 1"
                               + (f": {self._oom_error}" if self._oom_error else
                                  " on another rank"))
        old = (self.micro, self.accum)
        self.micro_cap = max(1, self.micro // 2)
        self.micro, self.accum = split_rank(self.counts[self.rank], self.micro_cap)
        self._log(f"out of memory at step {step} on some rank; micro {old[0]} x accum {old[1]}"
                  f" -> micro {self.micro} x accum {self.accum}, same global batch, redoing "
                  f"step {step}")
        mx.clear_cache()

    # -- main loop -----------------------------------------------------------------------

    def run(self) -> None:
        t, cfg = self.cfg.train, self.cfg
        tokens_per_step = t.global_batch * cfg.model.seq_len
        stop = t.stop_at or t.steps
        window: list[tuple[float, float | None]] = []
        self.out.mkdir(parents=True, exist_ok=True)
        ended = self._patience_ended()
        while self.step < stop and not ended:
            step = self.step + 1
            # At the run's last step, not at stop_at: a pause must not add an evaluation
            # (best and patience would count it, and a resume would differ from a straight run).
            evaluating = bool(t.eval_every) and (step % t.eval_every == 0 or step == t.steps)
            logged = step % t.log_every == 0 or step == stop or evaluating
            before = self.steps.snapshot()
            t0 = time.perf_counter()
            stats, compute = self._run_step(step, logged or self._calibration is not None)
            t3 = time.perf_counter()
            # Evaluated already: reading it waits for nothing. Dropped at once: a view of the
            # all-reduced gradients, it would keep their buffer alive through the next step.
            loss, flag, stuck = stats.tolist()
            del stats
            if flag < 1.0:  # some rank ran out of memory: every rank undoes the step
                self.steps.restore(before)
                self._backoff(step, stuck > 0)
                continue
            self._oom_error = ""
            del before
            self.step = step
            window.append((t3 - t0, compute))
            self._starting.stop()  # its first step's heartbeat is the loop's own from here
            self._progress(loss, tokens_per_step / (t3 - t0), protocol.RUNNING)
            hooks.fake_diverge(self.rank, step, self.model)
            if t.consistency_every and self.world > 1 and step % t.consistency_every == 0:
                self._check_consistency(step)
            val_loss = self._validate() if evaluating else None
            if logged:
                self._metrics(loss, window, tokens_per_step, val_loss)
                window = []
            if self._calibration is not None:  # after the metrics of the step it timed
                self._calibrate(compute)
            ended = evaluating and self._evaluated(val_loss)
            if t.checkpoint_every and (step % t.checkpoint_every == 0 or step == stop
                                       or ended):
                self._checkpoint()
            hooks.hold(step, lambda: self._progress(self._last_loss, self._last_tps,
                                                    protocol.RUNNING))
        self._starting.stop()  # a resume at or past its last step makes none
        self.prefetch.close()
        self._progress(self._last_loss, self._last_tps, protocol.FINISHED)
        self._log(f"done: {self.step} steps")

    def _validate(self) -> float:
        """The validation loss now (every rank: it all-sums)."""
        return self.evaluator.loss(self.batches, self.micro, self.cfg.train.eval_batches,
                                   self.group)

    def _evaluated(self, val_loss: float) -> bool:
        """Count an evaluation: a new best is saved in best/; True when patience ran out
        (the caller writes a checkpoint there, so that the run ends resumably)."""
        verdict = self.validation.observe(self.step, val_loss)
        self._last_val = val_loss
        if verdict.improved and self.writer:
            self._checkpoint(self.out / BEST_DIR, keep=1)
        return verdict.stop and self._patience_ended()

    def _patience_ended(self) -> bool:
        if not self.validation.exhausted:
            return False
        v = self.validation.state
        self._log(f"patience: {v.stale} evaluations without a new best validation loss "
                  f"(best {v.best_loss:.4f} at step {v.best_step}, kept in {BEST_DIR}/); "
                  f"ending at step {self.step}; resume with a larger train.patience to go on")
        return True

    def _calibrate(self, compute: float | None) -> None:
        """balance: auto: after a step for compilation and CALIBRATION_STEPS more, every
        rank's samples/s of compute, gathered; then the split by them. A rank's fastest
        step counts: what else runs on a machine only ever adds time to a step."""
        assert self._calibration is not None and compute is not None
        self._calibration.append(compute)
        if len(self._calibration) < 1 + CALIBRATION_STEPS:
            return
        local_speed = self.counts[self.rank] / min(self._calibration[1:])
        self._calibration = None
        speeds = all_gather_cpu(mx.array([local_speed], dtype=mx.float32), self.group).tolist()
        self.speeds, self.speed_hosts = speeds, host_names(self.group)
        before = self.counts
        after = self.balance.split(self.cfg.train.global_batch, self.world, speeds)
        if after != before:
            self._split(after)
        self._log(f"balance: auto: samples/s per rank {_rounded(speeds)}: split {before} -> "
                  f"{self.counts} (predicted compute "
                  f"{balance.step_seconds(before, speeds) * 1e3:.0f} -> "
                  f"{balance.step_seconds(self.counts, speeds) * 1e3:.0f} ms/step)")
        if self.writer:
            write_atomic(self.out / protocol.CALIBRATION, Calibration(
                step=self.step, world_size=self.world, hosts=self.speed_hosts,
                samples_per_sec=speeds, batch_split=self.counts, time=time.time()).to_json())

    def _check_consistency(self, step: int) -> None:
        """Compare every rank's state; on a mismatch take rank 0's (before a checkpoint of
        the same step is written, so that every node saves the same weights)."""
        mismatch = consistency.compare(
            consistency.state_items(self.model, self.optimizer), self.group)
        if mismatch is None:
            return
        consistency.repair(self.model, self.optimizer, self.group)
        self.repairs += 1
        self._log(f"consistency: step {step}: {mismatch.describe()}; rank 0's parameters and "
                  f"optimizer state sent to every rank (repair {self.repairs} of this run)")

    def _starting_beat(self) -> None:
        """The heartbeat before the first step: no step of this run yet (``step`` None)."""
        self._write_progress(protocol.Progress(
            rank=self.rank, step=None, time=time.time(), pid=os.getpid(),
            world_size=self.world, state=protocol.STARTING))

    def _write_progress(self, progress: protocol.Progress) -> None:
        path = self.out / protocol.progress_file(self.rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(progress.to_dict()) + "\n", durable=False)

    def _progress(self, loss: float | None, tps: float, state: str) -> None:
        self._last_loss, self._last_tps = loss, tps
        now = self._clock()
        if state == protocol.RUNNING and self._beat_at is not None and \
                now - self._beat_at < protocol.HEARTBEAT_EVERY:
            return  # written less than HEARTBEAT_EVERY ago: a later step will
        self._beat_at = now
        self._write_progress(protocol.Progress(
            rank=self.rank, step=self.step, loss=loss, time=time.time(), pid=os.getpid(),
            world_size=self.world, tokens_per_sec=tps, state=state, val_loss=self._last_val,
            best_val_loss=self.validation.state.best_loss,
            best_step=self.validation.state.best_step))

    def _metrics(self, loss: float, window: list, tokens_per_step: int,
                 val_loss: float | None = None) -> None:
        if self.rank != 0:
            return
        step_time = sum(w[0] for w in window) / len(window)
        # A fused step is timed in two parts only where it is logged: the share of compute
        # measured on the steps that were split applies to the window's mean step time
        # (when every step is split, as when accumulating, that is the plain mean).
        split = [w for w in window if w[1] is not None]
        share = sum(w[1] for w in split) / sum(w[0] for w in split)
        compute, comm = step_time * share, step_time * (1 - share)
        rec = MetricsLine(
            step=self.step, loss=loss, tokens_per_sec=tokens_per_step / step_time,
            time=time.time(), step_time=step_time, compute_time=compute, comm_time=comm,
            world_size=self.world, micro_batch=self.micro, accumulation=self.accum,
            lr=self.optimizer.learning_rate.item(), active_memory=mx.get_active_memory(),
            peak_memory=mx.get_peak_memory(), planned_memory=self._planned(),
            consistency_repairs=self.repairs, batch_split=self.counts, val_loss=val_loss,
            val_perplexity=None if val_loss is None else perplexity(val_loss))
        with open(self.out / protocol.METRICS, "a") as f:
            f.write(rec.line())
        val = "" if val_loss is None else f"val {val_loss:.4f} | "
        print(f"step {self.step} | loss {loss:.4f} | {val}{rec.tokens_per_sec:.0f} tok/s | "
              f"{step_time * 1e3:.1f} ms/step (compute {compute * 1e3:.1f}, all-reduce+update "
              f"{comm * 1e3:.1f}) | peak mem {rec.peak_memory / GB:.2f} GB", flush=True)

    def _planned(self) -> int:
        """The memory plan's peak for this rank as it runs now (trainer/plan.py)."""
        return plan.estimate(self.cfg, self.micro, self.accum, self.world).total

    def _checkpoint(self, where: Path | None = None, keep: int | None = None) -> None:
        """A checkpoint of now in ckpt/ (the rolling ones), or in ``where`` (best/)."""
        if not self.writer:
            return
        at = self.source.cursor(self.batches.cursor(self.step))
        state: dict[str, Any] = {
            "step": self.step, "data_cursor": self.batches.cursor(self.step),
            "data_position": at.to_dict() if at else None,
            "validation": self.validation.state.to_dict(),
            "rng_key": self.key.tolist(), "world_size": self.world,
            "micro_batch": self.micro, "accumulation": self.accum,
            "consistency_repairs": self.repairs, "batch_split": self.counts,
            "balance_speeds": self.speeds, "balance_hosts": self.speed_hosts,
            "config": self.cfg.to_dict(), "time": time.time(), "mlx_version": mx.__version__,
        }
        path = checkpoint.save(
            where or self.out / protocol.CKPT_DIR, self.step,
            dict(tree_flatten(self.model.parameters())), dict(tree_flatten(self.optimizer.state)),
            state, keep or self.cfg.train.keep,
        )
        if self.rank == 0:
            print(f"checkpoint: {path}", flush=True)

    def _log(self, msg: str) -> None:
        if self.rank == 0:
            print(msg, flush=True)


def train(cfg: TrainerConfig, resume: bool = False) -> None:
    Trainer(cfg, resume).run()


#: Public for fine-tuning's loop (mlxops/finetune/train.py), which backs off the same way.
is_oom = _is_oom
