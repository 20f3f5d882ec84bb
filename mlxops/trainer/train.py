"""The training loop: compiled data-parallel steps, checkpoints, metrics, OOM back-off."""

from __future__ import annotations

import json
import os
import time
from functools import partial
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from mlx.utils import tree_flatten, tree_map, tree_unflatten

from mlxops.node import protocol

from . import checkpoint
from .checkpoint import write_atomic
from .config import ConfigError, TrainerConfig, check_world, diff_resume_keys
from .data import Batches, make_source, split_batch
from .distributed import (
    all_gather_cpu,
    all_sum_cpu,
    expected_world_size,
    init_group,
    is_node_writer,
)
from .model import Transformer, count_params, loss_fn

GB = 1024**3


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
        check_world(cfg, self.world)  # mlxops launch checked it too, with the job's hosts
        self.writer = is_node_writer(self.group)
        t = cfg.train
        self.micro, self.accum = split_batch(t.global_batch, t.micro_batch, self.world)
        self.batches = Batches(make_source(cfg.data, cfg.model.vocab_size, cfg.model.seq_len),
                               t.global_batch, self.rank, self.world)
        self.dtype = mx.bfloat16 if t.dtype == "bfloat16" else mx.float32

        mx.random.seed(t.seed)
        self.model = Transformer(cfg.model, grad_checkpoint=t.grad_checkpoint)
        self.optimizer = make_optimizer(cfg)
        self.optimizer.init(self.model.trainable_parameters())
        # The trainer's own RNG key, saved and restored exactly (MLX's global key cannot be
        # set back); training itself draws no random numbers (no dropout).
        self.key = mx.random.key(t.seed)
        mx.eval(self.model.parameters(), self.optimizer.state)
        self.step = 0
        # What the last progress record said; a resume at or past the final step has none.
        self._last_loss: float | None = None
        self._last_tps = 0.0
        self._start(resume)
        self._compile()

    # -- start / resume ------------------------------------------------------------------

    def _start(self, resume: bool) -> None:
        ckpt_dir = self.out / protocol.CKPT_DIR
        latest = checkpoint.find_latest(ckpt_dir)
        mine = checkpoint.load_step(latest) if latest else -1
        # Every rank reads its own node's copy; all must agree on the step.
        steps = all_gather_cpu(mx.array([mine], dtype=mx.int32), self.group).tolist()
        if not resume:
            if max(steps) >= 0:
                raise ConfigError(
                    f"{self.cfg.out}: out: already holds checkpoints (newest step "
                    f"{max(steps)}); pass --resume to continue, or choose another out"
                )
            self._log(f"start: {count_params(self.model):,} parameters, world {self.world}, "
                      f"micro {self.micro} x accum {self.accum} x world {self.world} = "
                      f"global {self.cfg.train.global_batch}")
            return
        if len(set(steps)) != 1:
            raise TrainerError(f"ranks found different latest checkpoints (steps {steps}); "
                               "copy the newest checkpoint to every node")
        if mine < 0:
            self._log("resume: no checkpoint yet, starting at step 0")
            return
        assert latest is not None
        weights, opt, state = checkpoint.load(latest)
        diff = diff_resume_keys(state["config"], self.cfg)
        if diff:
            raise ConfigError(f"{latest / protocol.CKPT_STATE}: {diff[0]} (incompatible config)")
        self.model.load_weights(list(weights.items()), strict=True)
        self.optimizer.state = tree_unflatten(list(opt.items()))
        self.optimizer.init(self.model.trainable_parameters())
        self.key = mx.array(state["rng_key"], dtype=mx.uint32)
        self.step = state["step"]
        if state["data_cursor"] != self.batches.cursor(self.step):
            raise TrainerError(f"{latest}: data cursor {state['data_cursor']} does not match "
                               f"step {self.step}")
        mx.eval(self.model.parameters(), self.optimizer.state)
        if self.rank == 0:
            self._truncate_metrics(self.step)
        was = state.get("world_size")
        self._log(f"resume: step {self.step} from {latest} (saved with world {was}; now world "
                  f"{self.world}, micro {self.micro} x accum {self.accum})")
        if state["config"]["train"]["steps"] != self.cfg.train.steps:
            self._log("note: train.steps changed; the learning-rate schedule follows the new "
                      "value from here on")

    def _truncate_metrics(self, step: int) -> None:
        """Drop metrics logged after the checkpoint we resume from: they will be redone."""
        path = self.out / protocol.METRICS
        if not path.exists():
            return
        kept = [line for line in path.read_text().splitlines()
                if line.strip() and json.loads(line).get("step", 0) <= step]
        write_atomic(path, "".join(line + "\n" for line in kept))

    # -- compiled steps ------------------------------------------------------------------

    def _compile(self) -> None:
        model, optimizer, dtype = self.model, self.optimizer, self.dtype
        state = [model.state, optimizer.state]
        clip = self.cfg.train.grad_clip

        def loss_of(params: dict, x: mx.array, y: mx.array) -> mx.array:
            if dtype != mx.float32:
                # bf16 compute: cast a copy of the fp32 master weights; the cast is
                # differentiated, so the gradients come back in fp32.
                params = tree_map(lambda p: p.astype(dtype), params)
            model.update(params)
            return loss_fn(model, x, y)

        value_and_grad = mx.value_and_grad(loss_of)

        def grads(x: mx.array, y: mx.array) -> tuple[mx.array, dict]:
            params = model.trainable_parameters()
            loss, g = value_and_grad(params, x, y)
            model.update(params)  # the fp32 master weights, not the bf16 copy
            return loss, g

        @partial(mx.compile, inputs=state, outputs=state)
        def first_micro(x: mx.array, y: mx.array) -> tuple[mx.array, dict]:
            return grads(x, y)

        @partial(mx.compile, inputs=state, outputs=state)
        def next_micro(x: mx.array, y: mx.array, acc: dict) -> tuple[mx.array, dict]:
            loss, g = grads(x, y)
            return loss, tree_map(mx.add, acc, g)

        @partial(mx.compile, inputs=state, outputs=state)
        def apply(acc: dict, accum: mx.array) -> None:
            # The one all-reduce of the step: nn.average_gradients batches the small arrays
            # into few collectives; a no-op on one rank.
            g = nn.average_gradients(acc, group=self.group)
            g = tree_map(lambda a: a / accum, g)
            if clip > 0:
                g, _ = optim.clip_grad_norm(g, clip)
            optimizer.update(model, g)

        self._first, self._next, self._apply = first_micro, next_micro, apply

    def _compute(self, step: int) -> tuple[float, dict | None, bool]:
        """Forward/backward over this rank's micro-batches: (loss sum, grads, oom)."""
        hook = os.environ.get("MLXOPS_TRAINER_FAKE_OOM", "")
        acc, losses = None, []
        try:
            if hook and int(hook) == step and not getattr(self, "_faked", False):
                self._faked = True  # test hook: one simulated allocation failure
                raise MemoryError("[malloc] simulated allocation failure (test hook)")
            for x, y in self.batches.micro_batches(step, self.micro):
                x, y = mx.array(x), mx.array(y)
                loss, acc = self._first(x, y) if acc is None else self._next(x, y, acc)
                losses.append(loss)
                mx.eval(losses[-1], acc)
            return sum(v.item() for v in losses), acc, False
        except (RuntimeError, MemoryError) as e:
            if not _is_oom(e):
                raise
            self._oom_error = str(e).splitlines()[0]
            return 0.0, None, True

    def _backoff(self, step: int) -> None:
        if self.micro == 1:
            raise TrainerError(f"out of memory at step {step} with micro_batch 1: "
                               f"{self._oom_error}")
        t = self.cfg.train
        old = (self.micro, self.accum)
        self.micro, self.accum = split_batch(t.global_batch, self.micro // 2, self.world)
        self._log(f"out of memory at step {step} on some rank; micro {old[0]} x accum {old[1]}"
                  f" -> micro {self.micro} x accum {self.accum}, same global batch, redoing "
                  f"step {step}")
        mx.clear_cache()

    # -- main loop -----------------------------------------------------------------------

    def run(self) -> None:
        t, cfg = self.cfg.train, self.cfg
        tokens_per_step = t.global_batch * cfg.model.seq_len
        stop = t.stop_at or t.steps
        window: list[tuple[float, float, float]] = []
        self.out.mkdir(parents=True, exist_ok=True)
        while self.step < stop:
            step = self.step + 1
            params_before = self.model.parameters()
            t0 = time.perf_counter()
            loss_sum, acc, oom = self._compute(step)
            t1 = time.perf_counter()
            # One small CPU-stream reduction carries the loss and every rank's OOM flag, so
            # all ranks agree whether to back off before anyone enters the big all-reduce.
            red = all_sum_cpu(mx.array([loss_sum, float(oom)], dtype=mx.float32), self.group)
            total, any_oom = red.tolist()
            if any_oom:
                self.model.update(params_before)
                self._backoff(step)
                continue
            self._apply(acc, mx.array(float(self.accum)))
            mx.eval(self.model.state, self.optimizer.state)
            t3 = time.perf_counter()
            self.step = step
            loss = total / (self.accum * self.world)
            # comm_time counts the small reduction too: waiting there for slower peers is
            # time lost to synchronisation, not compute.
            window.append((t3 - t0, t1 - t0, t3 - t1))
            self._progress(loss, tokens_per_step / (t3 - t0), "running")
            if step % t.log_every == 0 or step == stop:
                self._metrics(loss, window, tokens_per_step)
                window = []
            if t.checkpoint_every and (step % t.checkpoint_every == 0 or step == stop):
                self._checkpoint()
        self._progress(self._last_loss, self._last_tps, "finished")
        self._log(f"done: {self.step} steps")

    def _progress(self, loss: float | None, tps: float, state: str) -> None:
        self._last_loss, self._last_tps = loss, tps
        path = self.out / protocol.progress_file(self.rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(protocol.Progress(
            rank=self.rank, step=self.step, loss=loss, time=time.time(), pid=os.getpid(),
            world_size=self.world, tokens_per_sec=tps, state=state).to_dict()) + "\n")

    def _metrics(self, loss: float, window: list, tokens_per_step: int) -> None:
        if self.rank != 0:
            return
        n = len(window)
        step_time = sum(w[0] for w in window) / n
        compute = sum(w[1] for w in window) / n
        comm = sum(w[2] for w in window) / n
        rec = {
            "step": self.step, "loss": loss, "tokens_per_sec": tokens_per_step / step_time,
            "time": time.time(), "step_time": step_time, "compute_time": compute,
            "comm_time": comm, "world_size": self.world, "micro_batch": self.micro,
            "accumulation": self.accum, "lr": self.optimizer.learning_rate.item(),
            "active_memory": mx.get_active_memory(), "peak_memory": mx.get_peak_memory(),
        }
        with open(self.out / protocol.METRICS, "a") as f:
            f.write(json.dumps(rec) + "\n")
        print(f"step {self.step} | loss {loss:.4f} | {rec['tokens_per_sec']:.0f} tok/s | "
              f"{step_time * 1e3:.1f} ms/step (compute {compute * 1e3:.1f}, all-reduce+update "
              f"{comm * 1e3:.1f}) | peak mem {rec['peak_memory'] / GB:.2f} GB", flush=True)

    def _checkpoint(self) -> None:
        if not self.writer:
            return
        state: dict[str, Any] = {
            "step": self.step, "data_cursor": self.batches.cursor(self.step),
            "rng_key": self.key.tolist(), "world_size": self.world,
            "micro_batch": self.micro, "accumulation": self.accum,
            "config": self.cfg.to_dict(), "time": time.time(), "mlx_version": mx.__version__,
        }
        path = checkpoint.save(
            self.out / protocol.CKPT_DIR, self.step, dict(tree_flatten(self.model.parameters())),
            dict(tree_flatten(self.optimizer.state)), state, self.cfg.train.keep,
        )
        if self.rank == 0:
            print(f"checkpoint: {path}", flush=True)

    def _log(self, msg: str) -> None:
        if self.rank == 0:
            print(msg, flush=True)


def train(cfg: TrainerConfig, resume: bool = False) -> None:
    Trainer(cfg, resume).run()
