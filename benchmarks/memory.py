"""The memory plan against the bundled trainer's measured peak, over a grid of configs.

Each config runs ``python -m mlxops.trainer`` for real (2 ranks: ring ranks on this
machine, mlxops/devtools/local_ranks.py) for a few steps with a checkpoint and a
consistency check among them, and reads rank 0's last ``metrics.jsonl`` record: the peak
MLX's allocator measured since the process started (``peak_memory``) and the plan the
trainer logs beside it (``planned_memory``, mlxops/trainer/plan.py). The plan holds when
it is within 15% of the peak and never more than 10% below it.

    python benchmarks/memory.py                     # 100 random configs
    python benchmarks/memory.py -n 40 --seed 7      # another 40
    python benchmarks/memory.py --jsonl runs.jsonl  # every measurement, one JSON per line

tests/trainer/test_plan.py runs a small fixed grid, one config per term, in the suite.

The grid varies what the plan's terms depend on: width, depth, heads, sequence length,
vocabulary, micro-batch, accumulation, compute dtype, gradient checkpointing, world size
and the all-reduce's dtype. Configs are drawn at random from those values (``--seed``),
with the largest kept under ``--max-mb`` of planned peak (a quarter of it in bfloat16, slow
on a CPU) so that the run fits this machine.
Ranks run with OpenBLAS preloaded where there is one, as mlxops starts them on Linux
(faster; the allocator's figures are the same).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


from mlxops.devtools.local_ranks import openblas_env, run_ranks  # noqa: E402
from mlxops.node.blas import find_openblas  # noqa: E402 - after the path
from mlxops.trainer.config import load_config  # noqa: E402
from mlxops.trainer.plan import estimate  # noqa: E402

MB = 1e6
#: The plan's bounds against the measured peak.
ABOVE, BELOW = 0.15, 0.10

#: What the random grid draws from.
SHAPES = {"dims": [64, 128, 192, 256, 384, 512], "layers": [1, 2, 3, 4, 6, 8],
          "heads": [1, 2, 4, 8], "seq_len": [32, 64, 128, 256, 512],
          "vocab_size": [256, 256, 1024, 4096, 16384]}
TRAIN = {"micro": [1, 2, 4, 8, 16], "accumulation": [1, 1, 2, 4],
         "dtype": ["float32", "bfloat16"], "grad_checkpoint": [False, True], "world": [1, 2],
         "grad_reduce_dtype": ["float32", "bfloat16"]}


def case(dims: int, layers: int, heads: int, seq_len: int, vocab_size: int, *, micro: int,
         accumulation: int = 1, dtype: str = "float32", grad_checkpoint: bool = False,
         world: int = 1, grad_reduce_dtype: str = "float32") -> dict:
    """One run: the trainer's config (3 steps, a checkpoint and a consistency check at
    step 2, every step logged) and its world size."""
    return {"world": world, "config": {
        "model": {"dims": dims, "layers": layers, "heads": heads, "seq_len": seq_len,
                  "vocab_size": vocab_size},
        "data": {"source": "synthetic", "seed": 1},
        "train": {"steps": 3, "log_every": 1, "checkpoint_every": 2, "keep": 1,
                  "consistency_every": 2, "global_batch": micro * accumulation * world,
                  "micro_batch": micro, "dtype": dtype, "grad_checkpoint": grad_checkpoint,
                  "grad_reduce_dtype": grad_reduce_dtype}}}


def random_grid(n: int, seed: int, max_mb: float) -> list[dict]:
    """``n`` configs drawn from SHAPES and TRAIN whose plan stays under ``max_mb``."""
    rng = random.Random(seed)
    out: list[dict] = []
    while len(out) < n:
        shape = {k: rng.choice(v) for k, v in SHAPES.items()}
        train = {k: rng.choice(v) for k, v in TRAIN.items()}
        if shape["dims"] % shape["heads"] or train["world"] == 1 and \
                train["grad_reduce_dtype"] != "float32":
            continue
        run = case(**shape, **train)
        cfg = load_config(run["config"])
        planned = estimate(cfg, train["micro"], train["accumulation"], run["world"]).total
        # bfloat16 matmuls are slow on a CPU: those runs stay smaller.
        if planned / MB <= max_mb / (4 if train["dtype"] == "bfloat16" else 1):
            out.append(run)
    return out


def measure(run: dict, blas: str | None) -> dict:
    """Run the trainer on ``run`` and return rank 0's last metrics record."""
    world = run["world"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if blas:
        env.update(openblas_env(blas, world))
    with tempfile.TemporaryDirectory(prefix="mlxops-memory-") as tmp:
        path = Path(tmp) / "trainer.json"
        path.write_text(json.dumps({**run["config"], "out": f"{tmp}/out"}))
        cmd = [sys.executable, "-m", "mlxops.trainer", "--config", str(path)]
        if world > 1:
            done = run_ranks(cmd, world, env=env, cwd=ROOT, timeout=1800)
        else:
            done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True,
                                  timeout=1800, stdin=subprocess.DEVNULL)
        if done.returncode:
            raise RuntimeError(f"trainer failed: {done.stderr[-1500:]}")
        lines = (Path(tmp) / "out" / "metrics.jsonl").read_text().splitlines()
        return json.loads(lines[-1])


def describe(run: dict) -> str:
    m, t = run["config"]["model"], run["config"]["train"]
    extra = [t["dtype"][:4] if t["dtype"] != "float32" else "",
             "ckpt" if t["grad_checkpoint"] else "",
             f"wire {t['grad_reduce_dtype'][:4]}" if t["grad_reduce_dtype"] != "float32"
             else ""]
    return (f"d{m['dims']} L{m['layers']} h{m['heads']} T{m['seq_len']} V{m['vocab_size']} "
            f"b{t['micro_batch']}x{t['global_batch'] // t['micro_batch'] // run['world']} "
            f"w{run['world']} " + " ".join(e for e in extra if e)).strip()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-n", type=int, default=100, help="random configs (default 100)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-mb", type=float, default=1500.0,
                   help="leave out configs planned above this many MB (default 1500)")
    p.add_argument("--jsonl", type=Path, help="append every measurement to this file")
    args = p.parse_args()
    runs = random_grid(args.n, args.seed, args.max_mb)
    blas = find_openblas() if sys.platform.startswith("linux") else None
    ratios = []
    started = time.monotonic()
    print(f"{'config':<46} {'planned MB':>10} {'peak MB':>9} {'plan/peak':>9}")
    for run in runs:
        rec = measure(run, blas)
        peak, planned = rec["peak_memory"], rec["planned_memory"]
        ratios.append(planned / peak)
        flag = "" if 1 - BELOW <= planned / peak <= 1 + ABOVE else "  OUT OF BOUNDS"
        print(f"{describe(run):<46} {planned / MB:>10.1f} {peak / MB:>9.1f} "
              f"{planned / peak:>9.3f}{flag}", flush=True)
        if args.jsonl:
            with args.jsonl.open("a") as f:
                f.write(json.dumps({**run, "peak_memory": peak, "planned_memory": planned,
                                    "metrics": rec}) + "\n")
    inside = sum(1 - BELOW <= r <= 1 + ABOVE for r in ratios)
    print(f"\n{len(ratios)} configs in {time.monotonic() - started:.0f} s: plan/peak from "
          f"{min(ratios):.3f} to {max(ratios):.3f}, median {sorted(ratios)[len(ratios) // 2]:.3f};"
          f" {inside} within [{1 - BELOW:.2f}, {1 + ABOVE:.2f}]")
    return 0 if inside == len(ratios) else 1


if __name__ == "__main__":
    sys.exit(main())
