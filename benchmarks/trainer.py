"""Benchmark the bundled trainer: tokens/s and the step-time split per world size.

Runs ``python -m mlxops.trainer`` for real (mlx.launch ring ranks on this machine for more
than one rank) on the synthetic corpus, then reads each run's metrics.jsonl. The first
``--skip`` steps (compilation, warm caches) are left out; figures are medians.

    python benchmarks/trainer.py                       # ranks 1,2,4 + grad-ckpt and bf16
    python benchmarks/trainer.py --ranks 1,2 --dims 512 --layers 8 --steps 30

compute   = forward/backward of all micro-batches of a step on one rank
all-reduce = the rest of the step: the loss/flag reduction (including waiting for slower
            ranks), nn.average_gradients and the optimizer update. At 1 rank it is the
            optimizer update alone, the floor to subtract when reading larger worlds.
Ranks share this machine's cores, so more ranks here measure the overheads of data
parallelism, not a speed-up; on a cluster each rank has its own machine.

BLAS (Linux): the runs above use the BLAS MLX's wheel carries (netlib's reference BLAS;
any LD_PRELOAD / OPENBLAS_NUM_THREADS of this shell is removed for them). Then the same
fp32 config at each of ``--blas-ranks`` world sizes runs again with this machine's
OpenBLAS preloaded as mlxops preloads it into ranks (``LD_PRELOAD``,
``OPENBLAS_NUM_THREADS`` = usable CPUs // ranks), printed side by side with the ratio, and
a 1024x1024x1024 float32 matmul is timed both ways (median of ``--matmul-repeat``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mlxops.node.blas import find_openblas, usable_cpus  # noqa: E402 - after the path

BLAS_VARS = ("LD_PRELOAD", "OPENBLAS_NUM_THREADS")
MATMUL = """
import statistics, sys, time
import mlx.core as mx
n, repeat = int(sys.argv[1]), int(sys.argv[2])
a = mx.random.normal((n, n)); b = mx.random.normal((n, n)); mx.eval(a, b)
mx.eval(a @ b)
times = []
for _ in range(repeat):
    t = time.perf_counter(); mx.eval(a @ b); times.append(time.perf_counter() - t)
print(statistics.median(times))
"""


def environment(blas: dict[str, str] | None) -> dict[str, str]:
    """This process's environment without a BLAS preload of its own, plus ``blas``."""
    env = {k: v for k, v in os.environ.items() if k not in BLAS_VARS}
    return {**env, **(blas or {})}


def openblas_env(library: str, ranks: int) -> dict[str, str]:
    """What mlxops gives each of ``ranks`` ranks on this machine (docs/job-file.md)."""
    return {"LD_PRELOAD": library, "OPENBLAS_NUM_THREADS": str(max(1, usable_cpus() // ranks))}


def matmul_seconds(n: int, repeat: int, blas: dict[str, str] | None) -> float:
    out = subprocess.run([sys.executable, "-c", MATMUL, str(n), str(repeat)], check=True,
                         env=environment(blas), capture_output=True, text=True, timeout=600)
    return float(out.stdout.strip().splitlines()[-1])


def run(args: argparse.Namespace, tmp: Path, ranks: int, name: str,
        blas: dict[str, str] | None = None, **train: object) -> dict:
    out = tmp / name
    cfg = {
        "model": {"dims": args.dims, "layers": args.layers, "heads": args.heads,
                  "vocab_size": 256, "seq_len": args.seq_len},
        "data": {"source": "synthetic", "seed": 0},
        "train": {"steps": args.steps, "global_batch": args.global_batch,
                  "micro_batch": args.micro_batch, "lr": 1e-3, "checkpoint_every": 0,
                  "log_every": 1, **train},
        "out": str(out),
    }
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(cfg))
    cmd = [sys.executable, "-m", "mlxops.trainer", "--config", str(path)]
    if ranks > 1:
        launch = str(Path(sys.executable).parent / "mlx.launch")
        cmd = [launch, "--hosts", ",".join(["127.0.0.1"] * ranks), "--backend", "ring",
               "--starting-port", str(random.randint(20000, 50000)), "--", *cmd]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, env=environment(blas))
    try:
        _, err = proc.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher and every rank it started
        proc.wait()
        sys.exit(f"{name}: no result within {args.timeout}s (is the machine busy?)")
    if proc.returncode:
        sys.exit(f"{name}: trainer failed:\n{err[-2000:]}")
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    recs = recs[args.skip:]

    def med(key: str) -> float:
        return statistics.median(r[key] for r in recs)

    return {"name": name, "ranks": ranks, "tokens_per_sec": med("tokens_per_sec"),
            "step_ms": med("step_time") * 1e3, "compute_ms": med("compute_time") * 1e3,
            "comm_ms": med("comm_time") * 1e3, "micro": recs[-1]["micro_batch"],
            "accum": recs[-1]["accumulation"], "loss": recs[-1]["loss"],
            "blas": "openblas" if blas else "wheel"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", default="1,2,4", help="world sizes to run, comma separated")
    p.add_argument("--variant-ranks", type=int, default=1,
                   help="world size of the grad-checkpointing and bf16 runs")
    p.add_argument("--dims", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--global-batch", type=int, default=16)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--skip", type=int, default=2, help="leading steps left out")
    p.add_argument("--timeout", type=float, default=300, help="seconds allowed per run")
    p.add_argument("--blas-ranks", default="1,2",
                   help="world sizes to run again with OpenBLAS preloaded ('' for none)")
    p.add_argument("--matmul", type=int, default=1024, help="n of the n^3 matmul timed")
    p.add_argument("--matmul-repeat", type=int, default=5)
    p.add_argument("--json", action="store_true", help="print the rows as JSON only")
    args = p.parse_args()

    library = find_openblas() if sys.platform.startswith("linux") else None
    blas_ranks = [int(x) for x in args.blas_ranks.split(",") if x.strip()] if library else []
    rows, blas_rows, matmul = [], [], []
    with tempfile.TemporaryDirectory(prefix="mlxops-bench-") as d:
        tmp = Path(d)
        for n in (int(x) for x in args.ranks.split(",")):
            rows.append(run(args, tmp, n, f"fp32 ranks={n}"))
        v = args.variant_ranks
        rows.append(run(args, tmp, v, f"grad-ckpt ranks={v}", grad_checkpoint=True))
        rows.append(run(args, tmp, v, f"bf16 ranks={v}", dtype="bfloat16"))
        rows.append(run(args, tmp, v, f"bf16+ckpt ranks={v}", dtype="bfloat16",
                        grad_checkpoint=True))
        for n in blas_ranks:
            wheel = next((r for r in rows if r["name"] == f"fp32 ranks={n}"), None) or \
                run(args, tmp, n, f"fp32 ranks={n}")
            fast = run(args, tmp, n, f"fp32 ranks={n} openblas", openblas_env(library, n))
            blas_rows.append((wheel, fast))
    if library:
        for blas in (None, openblas_env(library, 1)):
            seconds = matmul_seconds(args.matmul, args.matmul_repeat, blas)
            matmul.append({"name": f"matmul {args.matmul}^3", "seconds": seconds,
                           "blas": "openblas" if blas else "wheel"})
    if args.json:
        print(json.dumps(rows + [fast for _, fast in blas_rows] + matmul, indent=1))
        return
    print(f"model dims={args.dims} layers={args.layers} heads={args.heads} "
          f"seq_len={args.seq_len}, global batch {args.global_batch} "
          f"({args.global_batch * args.seq_len} tokens/step), median of steps "
          f"{args.skip + 1}..{args.steps}")
    head = (f"{'run':<20} {'micro x acc':>11} {'tok/s':>9} {'step ms':>9} {'compute ms':>11} "
            f"{'all-reduce ms':>14} {'comm %':>7}")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['name']:<20} {r['micro']:>5} x {r['accum']:<3} {r['tokens_per_sec']:>9.0f} "
              f"{r['step_ms']:>9.1f} {r['compute_ms']:>11.1f} {r['comm_ms']:>14.1f} "
              f"{100 * r['comm_ms'] / r['step_ms']:>6.1f}%")
    print_blas(library, blas_rows, matmul)


def print_blas(library: str | None, runs: list[tuple[dict, dict]], matmul: list[dict]) -> None:
    print()
    if not library:
        print("BLAS: no OpenBLAS on this machine to compare with (Debian, Ubuntu: "
              "apt-get install libopenblas0-pthread; nothing is preloaded on macOS)")
        return
    print(f"BLAS: the wheel's against {library} preloaded "
          f"(OPENBLAS_NUM_THREADS = {usable_cpus()} CPUs // ranks)")
    head = f"{'run':<20} {'wheel':>12} {'openblas':>12} {'ratio':>8}"
    print(head)
    print("-" * len(head))
    for wheel, fast in runs:
        print(f"{wheel['name']:<20} {wheel['tokens_per_sec']:>8.0f} t/s "
              f"{fast['tokens_per_sec']:>8.0f} t/s "
              f"{fast['tokens_per_sec'] / wheel['tokens_per_sec']:>7.1f}x")
    if len(matmul) == 2:
        slow, fast = matmul
        print(f"{slow['name'] + ' fp32':<20} {slow['seconds']:>10.3f} s {fast['seconds']:>10.4f} s "
              f"{slow['seconds'] / fast['seconds']:>7.1f}x")


if __name__ == "__main__":
    main()
