"""One measured run on whatever device MLX has, in a process of its own: what the GPU
benchmarks (gpu_bf16.py, gpu_profile.py, gpu_memory.py) start once per row.

A run is one of:

- ``trainer``: the bundled trainer itself (:func:`mlxops.trainer.train.trainer_loop`, its
  ``run()`` as ``python -m mlxops.trainer`` runs it, synthetic corpus, one rank), each
  step's time taken from the per-step progress record it makes (``tokens/s`` of that step);
- ``loop``: a plain mlx-lm loop: mlx-lm's ``llama`` model at the same shape, everything in
  the compute dtype (``model.set_dtype``, so AdamW's moments too), the trainer's AdamW and
  schedule, the loss as mlx-lm's ``default_loss`` takes it (cross-entropy of the logits in
  the model's dtype), one ``mx.compile`` over model and optimizer state, one ``mx.eval`` a
  step.

Each prints one JSON line: tokens/s (median over the steps after ``skip``), every step's
seconds, MLX's peak memory (``mx.get_peak_memory()``) and the memory plan of the trainer's
config (:func:`mlxops.trainer.plan.estimate`, for each backend it knows).
A fresh process per run: the peak is the run's own, and nothing compiled or cached by one
run speeds up the next.
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


@dataclass
class Row:
    """One configuration: model shape, tokens per step, compute dtype."""

    dims: int
    layers: int
    heads: int
    seq_len: int
    batch: int
    dtype: str = "float32"
    vocab_size: int = 256
    micro: int = 0          # 0: the whole batch in one micro-batch
    grad_checkpoint: bool = False
    options: dict = field(default_factory=dict)  # a variant's switches (gpu_profile.py)

    def label(self) -> str:
        return f"{self.dims}/{self.layers}/{self.heads}, {self.seq_len}, {self.batch}"

    def config(self, steps: int, out: str) -> dict[str, Any]:
        """The bundled trainer's config for this row."""
        return {
            "model": {"dims": self.dims, "layers": self.layers, "heads": self.heads,
                      "seq_len": self.seq_len, "vocab_size": self.vocab_size},
            "train": {"steps": steps, "global_batch": self.batch,
                      "micro_batch": self.micro or self.batch, "dtype": self.dtype,
                      "checkpoint_every": 0, "log_every": steps, "consistency_every": 0,
                      "grad_checkpoint": self.grad_checkpoint, "lr": 3e-4, "warmup": 0},
            "data": {"source": "synthetic", "prefetch": 2},
            "out": out,
        }


def backend() -> str:
    """The backend MLX computes on here: ``cuda``, ``metal`` or ``cpu``."""
    from mlxops.trainer.step import compute_backend

    return compute_backend()


def plans(cfg: Any, micro: int, accumulation: int) -> dict[str, int]:
    """The plan's peak for ``cfg`` under each backend's terms it has."""
    from mlxops.trainer import plan

    backends = getattr(plan, "BACKENDS", None)
    if backends is None:  # a plan without per-backend terms
        return {"any": plan.estimate(cfg, micro, accumulation, 1).total}
    return {b: plan.estimate(cfg, micro, accumulation, 1, backend=b).total for b in backends}


def summary(row: Row, kind: str, seconds: list[float], skip: int, extra: dict) -> dict:
    import mlx.core as mx

    timed = seconds[skip:] or seconds
    step = statistics.median(timed)
    return {"row": asdict(row), "kind": kind, "backend": backend(),
            "device": mx.device_info().get("device_name", "?"),
            "tok_s": row.batch * row.seq_len / step, "step_ms": step * 1e3,
            "seconds": [round(s, 6) for s in seconds], "peak": mx.get_peak_memory(),
            "mlx": mx.__version__, **extra}


def run_trainer(row: Row, steps: int, skip: int) -> dict:
    """The bundled trainer's ``run()`` for ``steps`` steps; each step's seconds from its
    progress records (the trainer times every step: tokens per step over its seconds)."""
    import mlx.core as mx

    from mlxops.node import protocol
    from mlxops.trainer import bundled, train
    from mlxops.trainer.config import load_config

    options = dict(row.options)
    split = options.pop("split", False)
    if options:  # a variant: the trainer's Steps with other switches (gpu_profile.py)
        bundled.Steps = partial(VariantSteps, **options)
    with tempfile.TemporaryDirectory() as out:
        config = row.config(steps, out)
        if split:  # every step logged: its compute / all-reduce+update split measured
            config["train"]["log_every"] = 1
        cfg = load_config(config)
        loop = train.trainer_loop(cfg, resume=False)
        work = loop.workload
        # MLX's peak once the model and optimizer exist, and after each step: which step
        # (or the set-up) the run's peak is in.
        setup_peak = mx.get_peak_memory()
        tokens = row.batch * row.seq_len
        seconds: list[float] = []
        peaks: list[int] = []
        active: list[int] = []  # what stays allocated between steps
        real = loop._progress

        def progress(loss: Any, tps: float, state: str) -> None:
            if state == protocol.RUNNING:
                seconds.append(tokens / tps)
                peaks.append(mx.get_peak_memory())
                active.append(mx.get_active_memory())
            real(loss, tps, state)

        loop._progress = progress  # type: ignore[method-assign]
        loop.run()
        extra = {"plan": plans(cfg, work.micro, work.accum),
                 "micro": work.micro, "accumulation": work.accum,
                 "working_copy": work.steps.copy is not None,
                 "grads_first": work.steps.grads_first,
                 "setup_peak": setup_peak, "step_peaks": peaks, "step_active": active}
        if split:
            metrics = [json.loads(x) for x in (Path(out) / protocol.METRICS).open()]
            extra["compute_ms"] = statistics.median(
                r["compute_time"] for r in metrics[skip:]) * 1e3
            extra["update_ms"] = statistics.median(r["comm_time"] for r in metrics[skip:]) * 1e3
        return summary(row, "trainer", seconds, skip, extra)


def _variant_steps() -> type:
    from mlxops.trainer.step import Steps

    class Variant(Steps):
        """The trainer's Steps with switches that only profiling wants."""

        def __init__(self, *args: Any, loss_bf16: bool = False, no_local: bool = False,
                     no_snapshot: bool = False, **kw: Any):
            self.no_local, self.no_snapshot = no_local, no_snapshot
            if loss_bf16:
                kw["loss"] = _bf16_loss
            super().__init__(*args, **kw)

        def _fused(self, *batch: Any) -> Any:
            stats, g = super()._fused(*batch)
            return (stats, stats) if self.no_local else (stats, g)

        def snapshot(self) -> Any:
            return None if self.no_snapshot else super().snapshot()

    return Variant


def _bf16_loss(model: Any, inputs: Any, targets: Any) -> Any:
    import mlx.core as mx
    import mlx.nn as nn

    return nn.losses.cross_entropy(model(inputs), targets).astype(mx.float32).mean()


def VariantSteps(*args: Any, **kw: Any) -> Any:  # noqa: N802 - stands for a class
    return _variant_steps()(*args, **kw)


def mlx_lm_llama() -> types.ModuleType:
    """mlx-lm's ``llama`` module, without running ``mlx_lm/__init__`` (which imports
    transformers, irrelevant here and not always importable beside the CUDA build)."""
    spec = importlib.util.find_spec("mlx_lm")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("mlx-lm is not installed (pip install mlx-lm)")
    if "mlx_lm" not in sys.modules:
        package = types.ModuleType("mlx_lm")
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules["mlx_lm"] = package
    from mlx_lm.models import llama

    return llama


def run_loop(row: Row, steps: int, skip: int) -> dict:
    """A plain mlx-lm-style loop over mlx-lm's llama at ``row``'s shape and dtype."""
    import mlx.core as mx
    import mlx.nn as nn

    from mlxops.trainer.config import load_config
    from mlxops.trainer.train import make_optimizer

    cfg = load_config(row.config(steps, "unused"))
    m = cfg.model
    mx.random.seed(0)
    if row.options.get("model") == "mlxops":  # the trainer's own model in the plain loop
        from mlxops.trainer.model import Transformer

        model = Transformer(m)
    else:
        llama = mlx_lm_llama()
        model = llama.Model(llama.ModelArgs(
            model_type="llama", hidden_size=m.dims, num_hidden_layers=m.layers,
            intermediate_size=m.hidden(), num_attention_heads=m.heads,
            rms_norm_eps=m.norm_eps, vocab_size=m.vocab_size, rope_theta=m.rope_base,
            tie_word_embeddings=True))
    if row.dtype == "bfloat16":
        model.set_dtype(mx.bfloat16)
    optimizer = make_optimizer(cfg)

    def loss_fn(model: nn.Module, x: mx.array, y: mx.array) -> mx.array:
        # mlx_lm.tuner.trainer.default_loss: the logits stay in the model's dtype.
        ce = nn.losses.cross_entropy(model(x), y)
        return ce.astype(mx.float32).mean()

    value_and_grad = nn.value_and_grad(model, loss_fn)
    state = [model.state, optimizer.state]

    split = row.options.get("split", False)

    @partial(mx.compile, inputs=state, outputs=state)
    def step(x: mx.array, y: mx.array) -> tuple[mx.array, Any]:
        loss, grads = value_and_grad(model, x, y)
        optimizer.update(model, grads)
        return (loss, grads) if split else (loss, loss)  # split: gradients materialised

    batches = [mx.random.randint(0, m.vocab_size, (row.batch, m.seq_len + 1))
               for _ in range(4)]
    mx.eval(model.parameters(), batches)
    seconds, computes, peaks, active = [], [], [], []
    for i in range(steps):
        t0 = time.perf_counter()
        tokens = batches[i % len(batches)]
        loss, grads = step(tokens[:, :-1], tokens[:, 1:])
        if split:
            mx.eval(grads)
            computes.append(time.perf_counter() - t0)
        del grads
        mx.eval(state, loss)
        seconds.append(time.perf_counter() - t0)
        peaks.append(mx.get_peak_memory())
        active.append(mx.get_active_memory())
    extra: dict[str, Any] = {"loss": loss.item(), "step_peaks": peaks, "step_active": active}
    if split:
        extra["compute_ms"] = statistics.median(computes[skip:]) * 1e3
        extra["update_ms"] = (statistics.median(seconds[skip:]) - extra["compute_ms"] / 1e3) * 1e3
    return summary(row, "loop", seconds, skip, extra)


KINDS = {"trainer": run_trainer, "loop": run_loop}


def measure(kind: str, row: Row, steps: int, skip: int, timeout: float = 600) -> dict:
    """Run ``kind`` over ``row`` in a fresh process; its JSON line, or ``{"error": ...}``."""
    spec = json.dumps({"kind": kind, "row": asdict(row), "steps": steps, "skip": skip})
    proc = subprocess.run([sys.executable, __file__, spec], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env={**os.environ})
    lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"kind": kind, "row": asdict(row), "error": proc.stderr.strip()[-1500:]}
    return json.loads(lines[-1])


def main() -> None:
    spec = json.loads(sys.argv[1])
    result = KINDS[spec["kind"]](Row(**spec["row"]), spec["steps"], spec["skip"])
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
