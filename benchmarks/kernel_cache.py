"""What a fresh MLX CPU kernel cache costs a job: the bundled trainer's first step with an
empty ``$TMPDIR/mlx`` against the same step once the kernels are compiled.

MLX's CPU backend compiles each fused kernel with g++ into ``$TMPDIR/mlx/<version>/cpu/``
and reuses what it finds there (mlxops/node/tempdir.py). mlxops gives every run a
temporary directory of its own; this measures why its ``mlx/`` links to a cache kept
across runs instead of starting empty.

    python benchmarks/kernel_cache.py                  # 1 and 3 ranks, 3 runs each
    python benchmarks/kernel_cache.py --ranks 1 --repeat 5

For each world size and run: a new empty temporary directory (cold), the trainer for
``--steps`` steps, then the same again in that directory (warm). Ranks on one machine
share it, as the ranks of one node share their run's. Figures: step 1's ``step_time``
from rank 0's metrics (the compiles happen in it), the whole run's wall time, and the
number of kernels compiled. Medians over ``--repeat``. OpenBLAS is not preloaded: it
does not change what is compiled.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mlxops.devtools.local_ranks import run_ranks  # noqa: E402 - after the path

MODEL = {"dims": 128, "layers": 2, "heads": 4, "vocab_size": 256, "seq_len": 64}


def run(tmp: Path, out: Path, ranks: int, steps: int) -> tuple[float, float]:
    """(step 1's step_time, wall seconds) of one trainer run with ``TMPDIR=tmp``."""
    config = {"model": MODEL, "data": {"source": "synthetic", "seed": 0},
              "train": {"steps": steps, "global_batch": 6 * ranks, "micro_batch": 6,
                        "log_every": 1, "checkpoint_every": 0}, "out": str(out)}
    path = out.with_suffix(".json")
    path.write_text(json.dumps(config))
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "TMP", "TEMP")}
    env.update(TMPDIR=str(tmp), PYTHONPATH=str(ROOT), MLXOPS_WORLD_SIZE=str(ranks))
    cmd = [sys.executable, "-m", "mlxops.trainer", "--config", str(path)]
    start = time.perf_counter()
    if ranks == 1:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    else:
        proc = run_ranks(cmd, ranks, env=env, timeout=1800)
    wall = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(f"trainer failed ({ranks} ranks): {proc.stderr[-2000:]}")
    first = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    return first["step_time"], wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="1,3", help="world sizes, comma-separated")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    print(f"bundled trainer {MODEL}, {args.steps} steps; median of {args.repeat}")
    print(f"{'ranks':>5}  {'kernels':>7}  {'step 1 cold':>11}  {'step 1 warm':>11}  "
          f"{'run cold':>9}  {'run warm':>9}")
    started = time.perf_counter()
    for ranks in (int(r) for r in args.ranks.split(",")):
        rows = []
        for _ in range(args.repeat):
            with tempfile.TemporaryDirectory(prefix="mlxops-kernels-") as d:
                tmp = Path(d) / "tmp"
                tmp.mkdir(mode=0o700)
                cold = run(tmp, Path(d) / "cold", ranks, args.steps)
                warm = run(tmp, Path(d) / "warm", ranks, args.steps)
                kernels = len(list(tmp.glob("mlx/*/cpu/*.so")))
                rows.append((kernels, *cold, *warm))
        kernels, step_cold, wall_cold, step_warm, wall_warm = (
            statistics.median(col) for col in zip(*rows, strict=True))
        print(f"{ranks:>5}  {kernels:>7.0f}  {step_cold:>10.2f}s  {step_warm:>10.2f}s  "
              f"{wall_cold:>8.1f}s  {wall_warm:>8.1f}s")
    load = os.getloadavg()[0]
    print(f"({time.perf_counter() - started:.0f} s in all; load average {load:.1f} at the end)")


if __name__ == "__main__":
    main()
