"""Benchmark the bundled trainer: tokens/s and the step-time split per world size.

Runs ``python -m mlxops.trainer`` for real (ring ranks on this machine for more than one
rank, started as mlx.launch starts them but without its launcher, which spins a core:
mlxops/devtools/local_ranks.py) on the synthetic corpus, then reads each run's
metrics.jsonl. The first ``--skip`` steps (compilation, warm caches) are left out;
figures are medians.

    python benchmarks/trainer.py                       # ranks 1,2,4 + grad-ckpt and bf16
    python benchmarks/trainer.py --ranks 1,2 --dims 512 --layers 8 --steps 30

compute   = forward/backward of all micro-batches of a step on one rank
all-reduce = the rest of the step: the loss/flag reduction (including waiting for slower
            ranks), nn.average_gradients and the optimizer update. At 1 rank it is the
            optimizer update alone, the floor to subtract when reading larger worlds.
Ranks share this machine's cores, so more ranks here measure the overheads of data
parallelism, not a speed-up; on a cluster each rank has its own machine.

BLAS (Linux): the runs above use the BLAS MLX's wheel carries (netlib's reference BLAS;
any LD_PRELOAD / OPENBLAS_* thread setting of this shell is removed for them). Then the
same fp32 config at each of ``--blas-ranks`` world sizes runs again with this machine's
OpenBLAS preloaded as mlxops preloads it into ranks (``LD_PRELOAD``,
``OPENBLAS_NUM_THREADS`` = usable CPUs // ranks, a short idle spin), printed side by side
with the ratio, and a 1024x1024x1024 float32 matmul is timed both ways (median of
``--matmul-repeat``).

Against a plain loop: at each ``--compare-ranks`` world size, the bundled trainer with
accumulation 1 (its fused step) and a plain mlx-lm-style loop (:func:`plain_loop`: the
same model code and data, AdamW with the same schedule, one ``mx.compile`` over model and
optimizer state with ``nn.average_gradients`` inside, one ``mx.eval`` per step, the loss
all-reduced at report steps) run the same config in turn, ``--compare-repeat`` times each,
alternating in ABBA order, with OpenBLAS preloaded where there is one (as ranks run on
Linux nodes).
Both are timed the same way: global tokens over the wall time from the end of step
``--compare-from`` to the end of the last step, on rank 0.
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
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mlxops.devtools.local_ranks import openblas_env, run_ranks  # noqa: E402
from mlxops.node.blas import find_openblas, usable_cpus  # noqa: E402 - after the path

BLAS_VARS = ("LD_PRELOAD", "OPENBLAS_NUM_THREADS", "OPENBLAS_THREAD_TIMEOUT")
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



def matmul_seconds(n: int, repeat: int, blas: dict[str, str] | None) -> float:
    out = subprocess.run([sys.executable, "-c", MATMUL, str(n), str(repeat)], check=True,
                         env=environment(blas), capture_output=True, text=True, timeout=600)
    return float(out.stdout.strip().splitlines()[-1])


def plain_loop(config: Path, times: Path) -> None:
    """One rank of a plain mlx-lm-style training loop over the bundled trainer's model.

    What ``mlx_lm.tuner.trainer.train`` does per step, without mlx_lm: the batch, one
    compiled step (loss and gradients, ``nn.average_gradients``, the AdamW update) over
    model and optimizer state, one ``mx.eval`` of the state and the loss; every
    ``train.log_every`` steps the summed losses go through a CPU all-reduce and ``.item()``.
    Rank 0 writes the wall time at the end of each step to ``times``.
    """
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim

    from mlxops.trainer.config import load_config
    from mlxops.trainer.data import Batches, make_source
    from mlxops.trainer.model import Transformer, loss_fn

    cfg = load_config(config)
    t = cfg.train
    group = mx.distributed.init()
    rank, world = group.rank(), group.size()
    mx.random.seed(t.seed)
    model = Transformer(cfg.model)
    lr = optim.cosine_decay(t.lr, max(1, t.steps - t.warmup), end=t.min_lr)
    if t.warmup:
        lr = optim.join_schedules([optim.linear_schedule(0.0, t.lr, t.warmup), lr], [t.warmup])
    optimizer = optim.AdamW(learning_rate=lr, weight_decay=t.weight_decay)
    batches = Batches(make_source(cfg.data, cfg.model.vocab_size, cfg.model.seq_len),
                      t.global_batch, rank, world)
    loss_value_and_grad = nn.value_and_grad(model, loss_fn)
    state = [model.state, optimizer.state]

    @partial(mx.compile, inputs=state, outputs=state)
    def step(x: mx.array, y: mx.array) -> mx.array:
        loss, grad = loss_value_and_grad(model, x, y)
        grad = nn.average_gradients(grad)
        optimizer.update(model, grad)
        return loss

    losses, ends = mx.array(0.0), []
    for it in range(1, t.steps + 1):
        (x, y), = batches.micro_batches(it, t.global_batch // world)
        losses += step(mx.array(x), mx.array(y))
        mx.eval(state, losses)
        if it % t.log_every == 0:
            mean = mx.distributed.all_sum(losses, stream=mx.cpu).item() / (world * t.log_every)
            losses = mx.array(0.0)
            if rank == 0:
                print(f"step {it} | loss {mean:.4f}", flush=True)
        ends.append(time.time())
    if rank == 0:
        times.write_text(json.dumps(ends))


def execute(name: str, cmd: list[str], ranks: int, env: dict[str, str],
            timeout: float) -> None:
    """``cmd`` as one process, or as ``ranks`` ring ranks on this machine (started as
    mlx.launch would, without its launcher spinning a core: mlxops/devtools/local_ranks.py)."""
    try:
        if ranks == 1:
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env,
                                  timeout=timeout, stdin=subprocess.DEVNULL)
        else:
            proc = run_ranks(cmd, ranks, env=env, cwd=ROOT, timeout=timeout)
    except subprocess.TimeoutExpired:
        sys.exit(f"{name}: no result within {timeout}s (is the machine busy?)")
    if proc.returncode:
        sys.exit(f"{name}: failed:\n{proc.stderr[-2000:]}")


def compare(args: argparse.Namespace, tmp: Path, ranks: int, library: str | None
            ) -> dict:
    """The trainer's fused step against :func:`plain_loop`, same config, alternating."""
    per_rank = args.global_batch // ranks
    cfg = {
        "model": {"dims": args.dims, "layers": args.layers, "heads": args.heads,
                  "vocab_size": 256, "seq_len": args.seq_len},
        "data": {"source": "synthetic", "seed": 0},
        "train": {"steps": args.compare_steps, "global_batch": args.global_batch,
                  "micro_batch": per_rank, "lr": 1e-3, "warmup": 5, "checkpoint_every": 0,
                  "log_every": args.compare_log_every},
    }
    env = environment(openblas_env(library, ranks) if library else None)
    env["PYTHONPATH"] = str(ROOT)
    tokens = args.global_batch * args.seq_len
    first = args.compare_from
    got: dict[str, list[float]] = {"trainer": [], "plain": []}
    # ABBA order (trainer, plain, plain, trainer, ...): a load that drifts during the runs
    # favours neither side.
    order = [who for i in range(args.compare_repeat)
             for who in (("trainer", "plain") if i % 2 == 0 else ("plain", "trainer"))]
    for i, who in enumerate(order):
        out = tmp / f"compare-{ranks}-{i}"
        path = tmp / f"compare-{ranks}-{i}.json"
        path.write_text(json.dumps({**cfg, "out": str(out)}))
        if who == "trainer":
            cmd = [sys.executable, "-m", "mlxops.trainer", "--config", str(path)]
        else:
            cmd = [sys.executable, str(Path(__file__).resolve()), "--plain-loop", str(path),
                   "--times", str(out.with_suffix(".times"))]
        execute(f"{who} ranks={ranks}", cmd, ranks, env, args.timeout)
        if who == "trainer":
            recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
            at = {r["step"]: r["time"] for r in recs}
        else:
            at = dict(enumerate(json.loads(out.with_suffix(".times").read_text()), 1))
        last = args.compare_steps
        got[who].append(tokens * (last - first) / (at[last] - at[first]))
    trainer, plain = (statistics.median(got[k]) for k in ("trainer", "plain"))
    return {"name": f"ranks={ranks}", "ranks": ranks, "trainer": trainer, "plain": plain,
            "ratio": trainer / plain, "runs": got,
            "blas": "openblas" if library else "wheel"}


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
    execute(name, cmd, ranks, environment(blas), args.timeout)
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
    p.add_argument("--parts", default="table,blas,compare",
                   help="what to run: table (world sizes and variants), blas (wheel against "
                        "OpenBLAS), compare (against a plain loop); comma separated")
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
    p.add_argument("--compare-ranks", default="1,2",
                   help="world sizes of the comparison with a plain loop")
    p.add_argument("--compare-steps", type=int, default=60)
    p.add_argument("--compare-from", type=int, default=10,
                   help="the comparison times the steps after this one")
    p.add_argument("--compare-log-every", type=int, default=10)
    p.add_argument("--compare-repeat", type=int, default=3,
                   help="runs of each side (alternating); the median counts")
    p.add_argument("--json", action="store_true", help="print the rows as JSON only")
    p.add_argument("--plain-loop", type=Path, metavar="CONFIG", help=argparse.SUPPRESS)
    p.add_argument("--times", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.plain_loop:  # one rank of the plain loop, started by compare()
        plain_loop(args.plain_loop, args.times)
        return
    if (args.compare_steps - args.compare_from) % args.compare_log_every or \
            args.compare_from % args.compare_log_every:
        p.error("--compare-from and --compare-steps must be multiples of --compare-log-every")
    parts = {x.strip() for x in args.parts.split(",") if x.strip()}

    library = find_openblas() if sys.platform.startswith("linux") else None
    blas_ranks = [int(x) for x in args.blas_ranks.split(",") if x.strip()] if library else []
    rows, blas_rows, matmul, compared = [], [], [], []
    with tempfile.TemporaryDirectory(prefix="mlxops-bench-") as d:
        tmp = Path(d)
        if "table" in parts:
            for n in (int(x) for x in args.ranks.split(",")):
                rows.append(run(args, tmp, n, f"fp32 ranks={n}"))
            v = args.variant_ranks
            rows.append(run(args, tmp, v, f"grad-ckpt ranks={v}", grad_checkpoint=True))
            rows.append(run(args, tmp, v, f"bf16 ranks={v}", dtype="bfloat16"))
            rows.append(run(args, tmp, v, f"bf16+ckpt ranks={v}", dtype="bfloat16",
                            grad_checkpoint=True))
        for n in blas_ranks if "blas" in parts else []:
            wheel = next((r for r in rows if r["name"] == f"fp32 ranks={n}"), None) or \
                run(args, tmp, n, f"fp32 ranks={n}")
            fast = run(args, tmp, n, f"fp32 ranks={n} openblas", openblas_env(library, n))
            blas_rows.append((wheel, fast))
        if "compare" in parts:
            for n in (int(x) for x in args.compare_ranks.split(",") if x.strip()):
                compared.append(compare(args, tmp, n, library))
    if library and "blas" in parts:
        for blas in (None, openblas_env(library, 1)):
            seconds = matmul_seconds(args.matmul, args.matmul_repeat, blas)
            matmul.append({"name": f"matmul {args.matmul}^3", "seconds": seconds,
                           "blas": "openblas" if blas else "wheel"})
    if args.json:
        print(json.dumps(rows + [fast for _, fast in blas_rows] + matmul + compared, indent=1))
        return
    if rows:
        print(f"model dims={args.dims} layers={args.layers} heads={args.heads} "
              f"seq_len={args.seq_len}, global batch {args.global_batch} "
              f"({args.global_batch * args.seq_len} tokens/step), median of steps "
              f"{args.skip + 1}..{args.steps}")
        head = (f"{'run':<20} {'micro x acc':>11} {'tok/s':>9} {'step ms':>9} "
                f"{'compute ms':>11} {'all-reduce ms':>14} {'comm %':>7}")
        print(head)
        print("-" * len(head))
        for r in rows:
            print(f"{r['name']:<20} {r['micro']:>5} x {r['accum']:<3} "
                  f"{r['tokens_per_sec']:>9.0f} {r['step_ms']:>9.1f} {r['compute_ms']:>11.1f} "
                  f"{r['comm_ms']:>14.1f} {100 * r['comm_ms'] / r['step_ms']:>6.1f}%")
    if "blas" in parts:
        print_blas(library, blas_rows, matmul)
    if compared:
        print_compare(args, compared, library)


def print_compare(args: argparse.Namespace, compared: list[dict], library: str | None
                  ) -> None:
    print()
    print(f"against a plain mlx-lm-style loop: dims={args.dims} layers={args.layers} "
          f"seq_len={args.seq_len}, global batch {args.global_batch}, accumulation 1, "
          f"{'OpenBLAS' if library else 'the wheel BLAS'}; tokens/s over steps "
          f"{args.compare_from + 1}..{args.compare_steps}, median of {args.compare_repeat}")
    head = f"{'ranks':<8} {'trainer':>12} {'plain loop':>12} {'ratio':>7}   runs (trainer / plain)"
    print(head)
    print("-" * len(head))
    for c in compared:
        runs = " ".join(f"{a:.0f}/{b:.0f}" for a, b in zip(c["runs"]["trainer"],
                                                           c["runs"]["plain"], strict=True))
        # pairs in the order run: trainer first in odd pairs, plain first in even ones
        print(f"{c['ranks']:<8} {c['trainer']:>8.0f} t/s {c['plain']:>8.0f} t/s "
              f"{c['ratio']:>6.2f}x   {runs}")


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
