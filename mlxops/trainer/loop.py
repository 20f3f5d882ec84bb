"""The run loop: one for every program that trains over MLX distributed.

The bundled trainer (:mod:`.bundled`) and fine-tuning (:mod:`mlxops.finetune.workload`) are
:class:`Workload`\\ s; :class:`Loop` drives either, the way mlx-lm's ``train()`` takes a
loss and a batch iterator. A workload says *what* is trained; the loop owns *how a run
goes*, identically for every workload:

- the ranks (``init_group``), who writes a node's files, the world-size rule;
- start and resume: the checkpoint every rank agrees on (:mod:`.resume`), the config keys
  it must share, the optimizer state, the step, the validation state, the measured
  speeds, and the metrics lines after it dropped;
- a step: the workload's micro-batches through its :class:`~.step.Steps`' ``run`` (one
  fused call, or ``first``/``next`` per micro-batch and ``apply``; pipeline stages:
  :class:`~.pipelinerun.PipelineSteps`), one host wait;
- the out-of-memory back-off: a rank whose step fails with MLX's out-of-memory
  (:mod:`.oom`) abstains from the step's collectives, every rank undoes the step and the
  workload makes its micro-batches smaller (:meth:`Workload.back_off`); where MLX would
  abort instead (Metal before 0.32) the start says the back-off is unavailable;
- ``balance: auto``'s calibration (a step to compile, then the fastest of
  :data:`CALIBRATION_STEPS`, gathered; the new split given to the workload);
- the consistency check every ``train.consistency_every`` steps, and its repair;
- validation every ``train.eval_every`` steps and at the schedule's last step (never at a
  ``stop_at`` pause, which would add an evaluation a straight run does not make), the
  best checkpoint in ``best/``, and ``train.patience`` (:mod:`.validation`; a resumed run
  whose patience is spent ends at once);
- the heartbeat (``progress/rank-<r>.json``, at most every ``HEARTBEAT_EVERY``, with the
  validation fields), the ``metrics.jsonl`` line and the console line (rank 0);
- checkpoints every ``train.checkpoint_every`` steps, at the run's last step and where
  patience ends it (0: only those two), each holding the loop's state and the workload's.

**A workload** (the :class:`Workload` protocol) supplies: its config (``cfg.train`` has
the keys of :mod:`.vocabulary`, ``cfg.out``, ``cfg.to_dict()``), the model and optimizer
(:meth:`~Workload.build`), the compiled step (:meth:`~Workload.compile`), this rank's
micro-batches of a step, the tokens of a step, the evaluation, its back-off, the weights
a checkpoint holds and the state it adds, how to read both back, and the words its log
lines use (:class:`Words`). A new kind of training (pipeline stages, a sharded optimizer)
is one more workload: it never re-implements the loop.

Longer than 400 lines because the loop is meant to read top to bottom in one place (as
nanoGPT's does): start, the step, the back-off, validation, calibration, consistency, the
heartbeat, the metrics line and checkpoints are its parts, each a method of one class.

Node side: standard library, mlx and numpy only.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from mlx.utils import tree_flatten

from mlxops.node import protocol
from mlxops.node.protocol.calibration import Calibration
from mlxops.node.protocol.layout import BEST_DIR
from mlxops.node.protocol.metrics import MetricsLine

from . import balance, checkpoint, consistency, hooks, oom
from .checkpoint import write_atomic
from .distributed import (
    all_gather_cpu,
    expected_world_size,
    host_names,
    init_group,
    is_node_writer,
)
from .errors import TrainerError
from .resume import agreed_checkpoint, load_compatible, restore_optimizer, truncate_metrics
from .startbeat import StartBeat
from .step import Steps
from .validation import Validation, ValidationState, perplexity

GB = 1024**3
#: balance: auto times this many steps (after one for compilation) before it splits.
CALIBRATION_STEPS = 3

Log = Callable[[str], None]


@dataclass(frozen=True)
class Place:
    """Where this process runs: its group, rank, the world size, and whether it writes
    its node's files (checkpoints)."""

    group: mx.distributed.Group
    rank: int
    world: int
    writer: bool


@dataclass(frozen=True)
class Words:
    """How a workload's log lines name its things (its users read them, tests hold them)."""

    unit: str          # one item of a global batch: "sample", "example"
    state: str         # what a consistency repair sends: "parameters", "trainable weights"
    smallest: str      # the micro-batch the back-off cannot go below
    #: The line that says patience ended the run; formatted with ``stale``, ``best``
    #: (the best loss), ``best_step``, ``step`` and ``best_dir``.
    patience: str


@dataclass(frozen=True)
class Figures:
    """A workload's own figures of a metrics line (:class:`MetricsLine`'s fields)."""

    micro_batch: int                     # rank 0's sequences (examples) per micro-batch
    accumulation: int                    # rank 0's micro-batches per step
    planned_memory: int | None = None    # the memory plan's peak (the bundled trainer)
    trainable_params: int | None = None  # the parameters it trains (fine-tuning)


class Workload(Protocol):
    """What the loop asks of a kind of training (see the module docstring)."""

    cfg: Any                     # .train (the shared keys), .out, .to_dict()
    words: Words
    model: nn.Module
    optimizer: optim.Optimizer
    steps: Steps                 # set by compile(); anything with Steps' run/abstain/...
    total: int                   # the schedule's last step (validation is made there)
    stop: int                    # the last step of this run (train.stop_at or total)
    trainable_only: bool         # consistency compares the trainable weights only
    #: Every rank holds the same state (data parallel): the consistency check compares
    #: them and one rank per node writes its checkpoints. False (pipeline stages): each
    #: rank holds its own part, writes it to ``ckpt/stage-<rank>/`` and nothing compares.
    replicated: bool

    def check_world(self, world: int) -> None: ...
    def diff_resume_keys(self, saved: dict[str, Any]) -> list[str]: ...
    def build(self, place: Place, counts: list[int], log: Log) -> None: ...
    def start_line(self) -> str: ...
    def check_validation(self) -> None: ...
    def resplit(self, counts: list[int]) -> None: ...
    def compile(self) -> None: ...
    def batches(self, step: int) -> list[tuple[mx.array, ...]]: ...
    def divisor(self, micro_batches: int) -> float: ...
    def tokens(self, step: int) -> int: ...
    def can_back_off(self) -> bool: ...
    def back_off(self) -> str: ...
    def shape(self) -> str: ...
    def evaluate(self) -> float | None: ...
    def figures(self) -> Figures: ...
    def weights(self) -> dict[str, mx.array]: ...
    def load_weights(self, weights: dict[str, mx.array], path: Path) -> None: ...
    def checkpoint_state(self, step: int) -> dict[str, Any]: ...
    def restore_state(self, state: dict[str, Any], path: Path, log: Log) -> None: ...
    def checkpoint_files(self) -> Callable[[Path], None] | None: ...
    def close(self) -> None: ...
    # The optimizer state: the same on every rank, or each rank's slice (ZeRO-1).
    @property
    def replicated_optimizer(self) -> Any: ...  # what the consistency check compares
    def restore_optimizer(self, saved: dict[str, mx.array], path: Path) -> None: ...
    def prepare_checkpoint(self, directory: Path, step: int) -> None: ...  # every rank
    def optimizer_state(self) -> dict[str, mx.array]: ...  # optimizer.safetensors


class ReplicatedOptimizer:
    """The optimizer-state half of a :class:`Workload` whose every rank holds the whole
    optimizer state (data parallelism): checkpointed by the node's writer, restored as
    saved, compared by the consistency check. A sharded one (ZeRO-1, the bundled
    trainer's :mod:`.zero`) answers these otherwise."""

    optimizer: optim.Optimizer
    model: nn.Module

    @property
    def replicated_optimizer(self) -> Any:
        return self.optimizer

    def restore_optimizer(self, saved: dict[str, mx.array], path: Path) -> None:
        restore_optimizer(self.optimizer, saved, self.model.trainable_parameters())

    def prepare_checkpoint(self, directory: Path, step: int) -> None:
        return None

    def optimizer_state(self) -> dict[str, mx.array]:
        return dict(tree_flatten(self.optimizer.state))


def _rounded(values: list[float]) -> list[float]:
    return [round(v, 1) for v in values]


class Loop:
    """One run of a :class:`Workload`: ``Loop(workload, resume).run()``."""

    def __init__(self, workload: Workload, resume: bool) -> None:
        self.workload = w = workload
        self.cfg = cfg = w.cfg
        self.out = Path(cfg.out)
        t = cfg.train
        group = init_group(expected_world_size())
        self.rank, self.world = group.rank(), group.size()
        self.group = group
        # Alive while it loads and compiles (startbeat.py), until its first step.
        self._starting = StartBeat(self._starting_beat).start()
        w.check_world(self.world)  # mlxops launch checked it too, with the job's hosts
        self.writer = is_node_writer(group) if w.replicated else True
        self.ckpt_dir = self.out / protocol.CKPT_DIR
        if not w.replicated:
            self.ckpt_dir = self.ckpt_dir / f"stage-{self.rank}"
        self.place = Place(group, self.rank, self.world, self.writer)
        # balance: auto measures each rank's speed in its first steps (trainer/balance.py);
        # until then, and with equal, every rank takes as many items as it can equally.
        self.balance = balance.Balance.of(t.balance)
        # Pipeline stages split layers, not the batch: each takes the whole global batch.
        self.counts = (self.balance.split(t.global_batch, self.world) if w.replicated
                       else [t.global_batch] * self.world)
        self.speeds: list[float] | None = None
        self.speed_hosts: list[str] | None = None  # the host of each rank speeds are for
        w.build(self.place, self.counts, self.log)
        if t.eval_every:
            w.check_validation()  # no validation data: refused now, not at the first one
        self.validation = Validation(t.patience)
        self.step = 0
        self.repairs = 0  # consistency repairs in this run (resume carries them on)
        self._oom_error = ""
        self._beat_at: float | None = None  # when the heartbeat was last written
        self._clock = time.monotonic  # what the heartbeat's interval is measured with
        # What the last progress record said; a resume at or past the final step has none.
        self._last_loss: float | None = None
        self._last_tps = 0.0
        self._last_val: float | None = None  # the last evaluation's loss
        self._start(resume)
        self._calibration: list[float] | None = None
        if self.balance.measures and self.world > 1 and self.speeds is None:
            self._calibration = []  # compute seconds per step, measured from the 2nd step
        w.compile()

    # -- start / resume ------------------------------------------------------------------

    def _start(self, resume: bool) -> None:
        w = self.workload
        # Every rank reads its own node's copy; all must agree on the step.
        latest = agreed_checkpoint(self.cfg.out, self.group, resume, self.ckpt_dir,
                                   oldest=not w.replicated)
        unavailable = oom.backoff_unavailable(mx.__version__, mx.metal.is_available())
        if unavailable:
            self.log(f"note: {unavailable}")
        if not resume:
            self.log(w.start_line())
            return
        if latest is None:
            self.log("resume: no checkpoint yet, starting at step 0")
            return
        weights, opt, state = load_compatible(latest, w.diff_resume_keys)
        w.load_weights(weights, latest)
        w.restore_optimizer(opt, latest)
        self.step = state["step"]
        self.repairs = state.get("consistency_repairs", 0)
        if state.get("validation"):
            self.validation.state = ValidationState.from_dict(state["validation"])
        if self.balance.measures and state.get("balance_speeds"):
            self._recorded_speeds(state)
        w.restore_state(state, latest, self.log)
        mx.eval(w.model.parameters(), w.optimizer.state)
        if self.rank == 0:
            truncate_metrics(self.out, self.step)
        self.log(f"resume: step {self.step} from {latest} (saved with world "
                 f"{state.get('world_size')}; now world {self.world}, {w.shape()})")
        if state["config"]["train"]["steps"] != self.cfg.train.steps:
            self.log("note: train.steps changed; the learning-rate schedule follows the new "
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
            self.log(f"balance: auto: the speeds recorded (hosts {measured_hosts}) do not "
                     f"fit the ranks now (hosts {hosts}); measuring again")
            return
        self.speeds, self.speed_hosts = speeds, hosts
        self._resplit(self.balance.split(self.cfg.train.global_batch, self.world, speeds))
        self.log(f"balance: auto: the speeds measured before ({self.workload.words.unit}s/s "
                 f"per rank {_rounded(speeds)}): split {self.counts}")

    def _resplit(self, counts: list[int]) -> None:
        self.counts = counts
        self.workload.resplit(counts)

    # -- one step ------------------------------------------------------------------------

    def _run_step(self, step: int, timed: bool) -> tuple[mx.array, float | None]:
        """Compute, all-reduce and update: (stats, seconds at which compute ended or None).

        ``timed`` (a logged step): measure the compute (the workload's ``steps.run`` says
        what that costs); compute counts from before the batches are read.
        """
        w = self.workload
        t0 = time.perf_counter()
        try:
            if hooks.fake_oom(self.rank, step):
                raise RuntimeError(f"{oom.COMMAND_BUFFER_OOM} (test hook)")
            batches = w.batches(step)
            hooks.fake_slow(self.rank, self.counts[self.rank])
            before = time.perf_counter() - t0
            stats, compute = w.steps.run(batches, w.divisor(len(batches)), timed)
            return stats, None if compute is None else before + compute
        except (RuntimeError, MemoryError) as e:
            if not oom.is_oom(e):
                raise
            self._oom_error = str(e).splitlines()[0]
        # Out of memory before this rank's collectives: join them with nothing, so that
        # its peers do not wait forever and all of them see the flag and undo the step.
        stats = w.steps.abstain(stuck=not w.can_back_off())
        mx.eval(stats)
        return stats, None

    def _backoff(self, step: int, stuck: bool) -> None:
        if stuck:
            raise TrainerError(f"out of memory at step {step} with "
                               f"{self.workload.words.smallest}"
                               + (f": {self._oom_error}" if self._oom_error else
                                  " on another rank"))
        change = self.workload.back_off()
        self.log(f"out of memory at step {step} on some rank; {change}, same global batch, "
                 f"redoing step {step}")
        mx.clear_cache()

    # -- main loop -----------------------------------------------------------------------

    def run(self) -> None:
        w, t = self.workload, self.cfg.train
        window: list[tuple[float, float | None, int]] = []
        self.out.mkdir(parents=True, exist_ok=True)
        ended = self._patience_ended()
        while self.step < w.stop and not ended:
            step = self.step + 1
            # At the schedule's last step, not at stop_at: a pause must not add an
            # evaluation (best and patience would count it, and a resume would differ
            # from a straight run).
            evaluating = bool(t.eval_every) and (step % t.eval_every == 0 or step == w.total)
            logged = step % t.log_every == 0 or step == w.stop or evaluating
            before = w.steps.snapshot()
            t0 = time.perf_counter()
            stats, compute = self._run_step(step, logged or self._calibration is not None)
            elapsed = time.perf_counter() - t0
            # Evaluated already: reading it waits for nothing. Dropped at once: a view of the
            # all-reduced gradients, it would keep their buffer alive through the next step.
            loss, flag, stuck = stats.tolist()
            del stats
            if flag < 1.0:  # some rank ran out of memory: every rank undoes the step
                w.steps.restore(before)
                self._backoff(step, stuck > 0)
                continue
            self._oom_error = ""
            del before
            self.step = step
            tokens = w.tokens(step)
            window.append((elapsed, compute, tokens))
            self._starting.stop()  # its first step's heartbeat is the loop's own from here
            self._progress(loss, tokens / elapsed, protocol.RUNNING)
            hooks.fake_diverge(self.rank, step, w.model)
            if t.consistency_every and self.world > 1 and w.replicated and \
                    step % t.consistency_every == 0:
                self._check_consistency(step)
            val = w.evaluate() if evaluating else None
            if logged or val is not None:
                self._metrics(loss, window, val)
                window = []
            if self._calibration is not None:  # after the metrics of the step it timed
                self._calibrate(compute)
            ended = val is not None and self._evaluated(val)
            if step == w.stop or ended or (t.checkpoint_every and
                                           step % t.checkpoint_every == 0):
                self._checkpoint()
            hooks.hold(step, lambda: self._progress(self._last_loss, self._last_tps,
                                                    protocol.RUNNING))
        w.close()
        self._starting.stop()  # a resume at or past its last step makes none
        self._progress(self._last_loss, self._last_tps, protocol.FINISHED)
        best = self.validation.state
        self.log(f"done: {self.step} steps" + (
            f"; best validation loss {best.best_loss:.4f} at step {best.best_step}"
            if best.best_loss is not None else ""))

    def _evaluated(self, val_loss: float) -> bool:
        """Count an evaluation: a new best is saved in best/; True when patience ran out
        (the caller writes a checkpoint there, so that the run ends resumably)."""
        verdict = self.validation.observe(self.step, val_loss)
        self._last_val = val_loss
        if verdict.improved:
            self._checkpoint(self.out / BEST_DIR, keep=1)
        return verdict.stop and self._patience_ended()

    def _patience_ended(self) -> bool:
        if not self.validation.exhausted:
            return False
        v = self.validation.state
        self.log(self.workload.words.patience.format(
            stale=v.stale, best=v.best_loss, best_step=v.best_step, step=self.step,
            best_dir=BEST_DIR))
        return True

    def _calibrate(self, compute: float | None) -> None:
        """balance: auto: after a step for compilation and CALIBRATION_STEPS more, every
        rank's items/s of compute, gathered; then the split by them. A rank's fastest
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
            self._resplit(after)
        self.log(f"balance: auto: {self.workload.words.unit}s/s per rank {_rounded(speeds)}: "
                 f"split {before} -> {self.counts} (predicted compute "
                 f"{balance.step_seconds(before, speeds) * 1e3:.0f} -> "
                 f"{balance.step_seconds(self.counts, speeds) * 1e3:.0f} ms/step)")
        if self.writer:
            write_atomic(self.out / protocol.CALIBRATION, Calibration(
                step=self.step, world_size=self.world, hosts=self.speed_hosts,
                samples_per_sec=speeds, batch_split=self.counts, time=time.time()).to_json())

    def _check_consistency(self, step: int) -> None:
        """Compare every rank's state; on a mismatch take rank 0's (before a checkpoint of
        the same step is written, so that every node saves the same weights)."""
        w = self.workload
        only = w.trainable_only
        mismatch = consistency.compare(
            consistency.state_items(w.model, w.replicated_optimizer, trainable_only=only),
            self.group)
        if mismatch is None:
            return
        consistency.repair(w.model, w.replicated_optimizer, self.group, trainable_only=only)
        w.steps.refresh()  # a bfloat16 working copy, cast again from the new weights
        self.repairs += 1
        self.log(f"consistency: step {step}: {mismatch.describe()}; rank 0's {w.words.state} "
                 f"and optimizer state sent to every rank (repair {self.repairs} of this run)")

    # -- what the run tells -----------------------------------------------------------------

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

    def _metrics(self, loss: float, window: list[tuple[float, float | None, int]],
                 val_loss: float | None) -> None:
        if self.rank != 0:
            return
        w = self.workload
        step_time = sum(x[0] for x in window) / len(window)
        # A fused step is timed in two parts only where it is logged: the share of compute
        # measured on the steps that were split applies to the window's mean step time
        # (when every step is split, as when accumulating, that is the plain mean).
        split = [x for x in window if x[1] is not None]
        share = sum(x[1] for x in split) / sum(x[0] for x in split) if split else 1.0
        compute, comm = step_time * share, step_time * (1 - share)
        tps = sum(x[2] for x in window) / sum(x[0] for x in window)
        figures = w.figures()
        rec = MetricsLine(
            step=self.step, loss=loss, tokens_per_sec=tps, time=time.time(),
            step_time=step_time, compute_time=compute, comm_time=comm,
            world_size=self.world, lr=w.optimizer.learning_rate.item(),
            active_memory=mx.get_active_memory(), peak_memory=mx.get_peak_memory(),
            consistency_repairs=self.repairs, batch_split=self.counts, val_loss=val_loss,
            val_perplexity=None if val_loss is None else perplexity(val_loss),
            micro_batch=figures.micro_batch, accumulation=figures.accumulation,
            planned_memory=figures.planned_memory, trainable_params=figures.trainable_params)
        with open(self.out / protocol.METRICS, "a") as f:
            f.write(rec.line())
        val = "" if val_loss is None else f"val {val_loss:.4f} | "
        print(f"step {self.step} | loss {loss:.4f} | {val}{tps:.0f} tok/s | "
              f"{step_time * 1e3:.1f} ms/step (compute {compute * 1e3:.1f}, all-reduce+update "
              f"{comm * 1e3:.1f}) | peak mem {rec.peak_memory / GB:.2f} GB", flush=True)

    def _checkpoint(self, where: Path | None = None, keep: int | None = None) -> None:
        """A checkpoint of now in ckpt/ (the rolling ones), or in ``where`` (best/)."""
        w = self.workload
        # Every rank: what a sharded optimizer gathers and stages (its collectives).
        w.prepare_checkpoint(where or self.out / protocol.CKPT_DIR, self.step)
        if not self.writer:
            return
        state: dict[str, Any] = {
            "step": self.step, "validation": self.validation.state.to_dict(),
            "world_size": self.world, "consistency_repairs": self.repairs,
            "batch_split": self.counts, "balance_speeds": self.speeds,
            "balance_hosts": self.speed_hosts, **w.checkpoint_state(self.step),
            "config": self.cfg.to_dict(), "time": time.time(), "mlx_version": mx.__version__,
        }
        path = checkpoint.save(
            where or self.ckpt_dir, self.step, w.weights(),
            w.optimizer_state(), state, keep or self.cfg.train.keep,
            extra=w.checkpoint_files())
        if self.rank == 0:
            print(f"checkpoint: {path}", flush=True)

    def log(self, msg: str) -> None:
        """A line of the run's log (rank 0 prints it)."""
        if self.rank == 0:
            print(msg, flush=True)
