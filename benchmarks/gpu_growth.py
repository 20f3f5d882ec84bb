"""Does MLX's peak grow over a run's steps on a GPU, in the bundled trainer and in a plain
mlx-lm loop alike, and does what stays allocated between steps grow with it? (issue 33: the
memory plan's runs on CUDA peaked 1.1x to 2.5x higher after a few steps than after the
first.) Each run records MLX's peak and active memory after every step (gpu_runs.py).

    python benchmarks/gpu_growth.py --jsonl $OUT/growth.jsonl [--steps 12]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_runs import Row, measure  # noqa: E402 - after the path

#: (kind, row): configs whose peak grew most in gpu_memory.py --fresh / --third.
RUNS = [
    ("trainer", Row(1152, 9, 18, 512, 16, "float32")),
    ("loop", Row(1152, 9, 18, 512, 16, "float32")),
    ("trainer", Row(1152, 9, 18, 512, 16, "bfloat16")),
    ("loop", Row(1152, 9, 18, 512, 16, "bfloat16")),
    ("trainer", Row(1792, 14, 14, 512, 8, "bfloat16")),
    ("loop", Row(1792, 14, 14, 512, 8, "bfloat16")),
    ("trainer", Row(896, 12, 7, 1024, 8, "bfloat16", grad_checkpoint=True)),
]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--jsonl", type=Path, required=True)
    a = p.parse_args()
    for kind, row in RUNS:
        r = measure(kind, row, a.steps, 0)
        with a.jsonl.open("a") as f:
            f.write(json.dumps(r) + "\n")
        if "error" in r:
            print(f"{kind} {row.label()} {row.dtype}: failed {r['error'][-300:]}", flush=True)
            continue
        gb = lambda xs: " ".join(f"{x / 1e9:.2f}" for x in xs)  # noqa: E731
        print(f"{kind:7s} {row.label():22s} {row.dtype:8s} ckpt {int(row.grad_checkpoint)}\n"
              f"  peak   {gb(r['step_peaks'])}\n  active {gb(r['step_active'])}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
