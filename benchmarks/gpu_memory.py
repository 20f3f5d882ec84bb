"""The memory plan against MLX's measured peak on a GPU, over a grid of configs: the runs
the plan's per-backend terms are fitted to (mlxops/trainer/plan.py).

Each config runs the bundled trainer (gpu_runs.py: ``Trainer.run()``, one rank, a fresh
process) for ``--steps`` steps and records MLX's peak (``mx.get_peak_memory()``) beside the
plan for every backend. The grid varies, around issue 33's first row, what the terms
depend on: sequence length at equal tokens, tokens, width and heads, depth, vocabulary,
accumulation and gradient checkpointing, each in float32 and bfloat16. One rank only: the
all-reduce's terms are the CPU's (no second GPU measured).

    python benchmarks/gpu_memory.py --jsonl $OUT/memory.jsonl
    python benchmarks/gpu_memory.py --tiny            # on a CPU, to check the script
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_runs import Row, measure  # noqa: E402 - after the path

#: dims, layers, heads, seq_len, batch, and keys of Row to change.
GRID = [
    (1024, 8, 16, 512, 16, {}),
    (1024, 8, 16, 1024, 8, {}),
    (1024, 8, 16, 2048, 4, {}),
    (1024, 8, 16, 512, 32, {}),
    (1024, 8, 16, 512, 4, {}),
    (512, 4, 8, 512, 16, {}),
    (1536, 12, 12, 1024, 8, {}),
    (1024, 8, 16, 512, 16, {"vocab_size": 32768}),
    (1024, 8, 16, 512, 16, {"grad_checkpoint": True}),
    (1024, 8, 16, 512, 32, {"micro": 8}),
    (2048, 16, 16, 512, 8, {}),
    (1024, 24, 16, 512, 8, {}),
]
#: Configs the terms were not fitted to, to check them (out of sample).
CHECK = [
    (768, 6, 12, 1024, 8, {}),
    (1280, 10, 10, 512, 16, {}),
    (1024, 8, 16, 256, 32, {"vocab_size": 8192}),
    (1536, 8, 12, 512, 8, {"grad_checkpoint": True}),
    (1024, 12, 8, 512, 32, {"micro": 16}),
    (2560, 8, 20, 512, 4, {}),
]
#: A second set the terms were not fitted to (issue 33's refit of the bfloat16 and
#: checkpointing terms): head dims 64 and 128, depths 6 to 16, accumulation, a vocabulary,
#: checkpointing at both head dims.
FRESH = [
    (896, 7, 14, 512, 16, {}),
    (1536, 16, 24, 512, 8, {}),
    (1792, 14, 14, 512, 8, {}),
    (1024, 16, 8, 1024, 8, {}),
    (2048, 8, 16, 512, 8, {}),
    (3072, 6, 24, 256, 8, {}),
    (1024, 6, 16, 512, 16, {"vocab_size": 16384}),
    (768, 12, 12, 512, 32, {"micro": 8}),
    (1280, 10, 20, 512, 16, {"grad_checkpoint": True}),
    (2048, 12, 16, 1024, 4, {"grad_checkpoint": True}),
]
#: A third set, for the terms refitted to the grid, CHECK and FRESH (all 60 runs).
THIRD = [
    (640, 5, 10, 1024, 16, {}),
    (1152, 9, 18, 512, 16, {}),
    (1280, 20, 10, 512, 8, {}),
    (2304, 10, 18, 512, 4, {}),
    (1536, 10, 12, 256, 32, {"vocab_size": 4096}),
    (1024, 10, 16, 512, 64, {"micro": 16}),
    (1792, 8, 28, 512, 8, {"grad_checkpoint": True}),
    (896, 12, 7, 1024, 8, {"grad_checkpoint": True}),
]
TINY = [(64, 2, 4, 32, 4, {}), (64, 2, 4, 64, 4, {"micro": 2}),
        (64, 2, 4, 32, 4, {"grad_checkpoint": True})]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--check", action="store_true", help="the configs the fit did not see")
    p.add_argument("--fresh", action="store_true", help="a second set it did not see")
    p.add_argument("--third", action="store_true", help="a third (after the refit to 60)")
    p.add_argument("--jsonl", type=Path, help="append every run's record here")
    p.add_argument("--options", type=json.loads, default={},
                   help="switches of the trainer's Steps, as JSON (gpu_runs.VariantSteps)")
    a = p.parse_args()
    for dtype in a.dtypes.split(","):
        for dims, layers, heads, seq, batch, keys in (
                TINY if a.tiny else CHECK if a.check else FRESH if a.fresh
                else THIRD if a.third else GRID):
            row = Row(dims, layers, heads, seq, batch, dtype, **keys, options=a.options)
            r = measure("trainer", row, a.steps, 0)
            if a.jsonl:
                with a.jsonl.open("a") as f:
                    f.write(json.dumps(r) + "\n")
            if "error" in r:
                print(f"{row.label()} {keys} {dtype}: failed {r['error'][-300:]}", flush=True)
                continue
            plans = " ".join(f"{b} {v / r['peak']:.2f}" for b, v in r["plan"].items())
            print(f"{row.label():24s} {str(keys):28s} {dtype:8s} peak {r['peak'] / 1e9:6.2f} GB"
                  f"  plan/peak: {plans}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
