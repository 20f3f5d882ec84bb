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


def run(args: argparse.Namespace, tmp: Path, ranks: int, name: str, **train: object) -> dict:
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
                            text=True, start_new_session=True)
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
            "accum": recs[-1]["accumulation"], "loss": recs[-1]["loss"]}


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
    p.add_argument("--json", action="store_true", help="print the rows as JSON only")
    args = p.parse_args()

    rows = []
    with tempfile.TemporaryDirectory(prefix="mlxops-bench-") as d:
        tmp = Path(d)
        for n in (int(x) for x in args.ranks.split(",")):
            rows.append(run(args, tmp, n, f"fp32 ranks={n}"))
        v = args.variant_ranks
        rows.append(run(args, tmp, v, f"grad-ckpt ranks={v}", grad_checkpoint=True))
        rows.append(run(args, tmp, v, f"bf16 ranks={v}", dtype="bfloat16"))
        rows.append(run(args, tmp, v, f"bf16+ckpt ranks={v}", dtype="bfloat16",
                        grad_checkpoint=True))
    if args.json:
        print(json.dumps(rows, indent=1))
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


if __name__ == "__main__":
    main()
