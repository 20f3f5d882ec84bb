"""The bfloat16 working copy against the cast of the masters every step, on whatever device
MLX has (a CPU, a Mac's GPU, CUDA): two trainer Steps, one of each, stepped in turn in one
process, so that whatever else loads the machine weighs on both alike.

Prints each one's median step and the median of the per-pair ratio (copy / cast; below 1:
the copy is faster). The trainer's own step otherwise (trainer/step.py), its benchmark
shape by default (benchmarks/trainer.py: 128 dims, 2 layers, 4 heads, seq 64, 4 sequences).

    python benchmarks/gpu_copy_ab.py
    python benchmarks/gpu_copy_ab.py --dims 1024 --layers 8 --heads 16 --seq-len 512 --batch 16
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlx.core as mx  # noqa: E402

from mlxops.trainer.config import load_config  # noqa: E402
from mlxops.trainer.model import Transformer  # noqa: E402
from mlxops.trainer.step import Steps, compute_backend  # noqa: E402
from mlxops.trainer.train import make_optimizer  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (("dims", 128), ("layers", 2), ("heads", 4), ("seq-len", 64),
                          ("batch", 4), ("pairs", 80), ("skip", 10)):
        p.add_argument(f"--{name}", type=int, default=default)
    a = p.parse_args()
    cfg = load_config({"model": {"dims": a.dims, "layers": a.layers, "heads": a.heads,
                                 "seq_len": a.seq_len},
                       "train": {"dtype": "bfloat16", "steps": a.pairs}})

    def make(copy: bool) -> Steps:
        mx.random.seed(0)
        model = Transformer(cfg.model)
        optimizer = make_optimizer(cfg)
        optimizer.init(model.trainable_parameters())
        mx.eval(model.parameters(), optimizer.state)
        return Steps(model, optimizer, mx.distributed.init(), mx.bfloat16, 0.0,
                     working_copy=copy)

    tokens = mx.random.randint(0, cfg.model.vocab_size, (a.batch, a.seq_len + 1))
    mx.eval(tokens)
    steps = {"cast": make(False), "copy": make(True)}
    times: dict[str, list[float]] = {"cast": [], "copy": []}
    for i in range(a.pairs):
        for name in (("cast", "copy") if i % 2 == 0 else ("copy", "cast")):
            s = steps[name]
            t0 = time.perf_counter()
            before = s.snapshot()  # as the trainer keeps it through a step
            stats, local = s.fused(tokens[:, :-1], tokens[:, 1:])
            del local
            mx.eval(stats, s.state)
            del before
            times[name].append(time.perf_counter() - t0)
    cast, copy = times["cast"][a.skip:], times["copy"][a.skip:]
    ratio = statistics.median(b / c for b, c in zip(copy, cast, strict=True))
    print(f"{compute_backend()}: cast {statistics.median(cast) * 1e3:.2f} ms, copy "
          f"{statistics.median(copy) * 1e3:.2f} ms; copy / cast {ratio:.3f} "
          f"(median of {len(cast)} pairs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
