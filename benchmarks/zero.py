"""Benchmark ZeRO-1 (mlxops/trainer/zero.py) against the unsharded step at the same config.

Runs N ring ranks on this machine (mlxops/devtools/local_ranks.py), each process one
mode, so that its peak memory is its own: ``plain`` (trainer/step.py's ``Steps``) then
``zero`` (``ZeroSteps``), ABAB, ``--repeat`` times. Per run, rank 0 reports the median step
time after ``--skip`` warm-up steps and every rank its peak (``mx.get_peak_memory()``)
beside the memory plan's (trainer/plan.py, ``estimate(..., shard=...)``).

The extra ``all_gather`` is predicted as ``mlxops plan`` would from a bench: before the
runs, the bench's own sweep on the same ranks (mlxops/node/allreduce.py's ``sweep``:
``all_sum`` and ``all_gather`` at 4 KiB to ``--sweep-to`` bytes, powers of two) is fitted
``t(S) = a + b S`` per collective (mlxops/bench/results.py's ``fit``) and
``all_gather_us`` turns it into the gather of the weights; the same ranks then time that
gather alone (median of 10), in the run's dtype. Printed: sharded minus unsharded step
time, and the gather alone, against that prediction (target: within 20%) and against the
all-reduce fit's (the rule before the bench swept all_gather), and each mode's measured
peak against its plan (target: within 15%, never more than 10% below). ``--save FILE``
writes the sweep's rows, the fits and the gather alone as JSON (recorded numbers for
tests).

    python benchmarks/zero.py                        # 2 ranks, float32
    python benchmarks/zero.py --ranks 3 --dtype bfloat16

The machine's load matters (other processes share its cores): say it with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mlxops.devtools.local_ranks import run_ranks  # noqa: E402 - after the path


def _config(args) -> dict:
    return {"model": {"dims": args.dims, "layers": args.layers, "heads": args.heads,
                      "vocab_size": args.vocab, "seq_len": args.seq},
            "data": {"source": "synthetic"},
            "train": {"steps": 1000, "global_batch": args.micro * args.ranks,
                      "micro_batch": args.micro, "dtype": args.dtype, "lr": 1e-3,
                      "warmup": 0}}


def rank_main(mode: str, config: str, steps: int, skip: int, out: str,
              sweep_to: int = 0) -> None:
    """One rank of one run (``mode``: plain, zero or sweep)."""
    import mlx.core as mx
    import numpy as np

    from mlxops.trainer import plan, zero
    from mlxops.trainer.config import load_config
    from mlxops.trainer.model import Transformer
    from mlxops.trainer.step import Steps
    from mlxops.trainer.train import make_optimizer

    group = mx.distributed.init(strict=True)
    rank, world = group.rank(), group.size()
    if mode == "sweep":  # the bench's own sweep (all_sum, all_gather), then the gather
        from mlxops.node.allreduce import sweep

        sizes = [4096 << i for i in range(max(1, (sweep_to // 4096).bit_length()))]
        rows = sweep(sizes, group, target=0.3, min_iters=3, max_iters=200,
                     beat=lambda *_: None)
        # ZeRO-1's all_gather alone, as the step makes it: every rank's slice of the
        # weights (its padded share), in the run's dtype.
        cfg = load_config(json.loads(config))
        dtype = mx.bfloat16 if cfg.train.dtype == "bfloat16" else mx.float32
        piece = mx.ones((-(-plan.count_params(cfg) // world),), dtype)
        times = []
        for _ in range(12):
            t0 = time.perf_counter()
            mx.eval(mx.distributed.all_gather(piece, group=group))
            times.append(time.perf_counter() - t0)
        Path(f"{out}.{rank}").write_text(json.dumps({
            **rows, "gather_bytes": piece.nbytes * world,
            "gather_us": statistics.median(times[2:]) * 1e6}))
        return
    cfg = load_config(json.loads(config))
    compute = mx.bfloat16 if cfg.train.dtype == "bfloat16" else mx.float32
    mx.random.seed(0)
    model, opt = Transformer(cfg.model), make_optimizer(cfg)
    if mode == "zero":
        st = zero.ZeroSteps(model, opt, group, compute, cfg.train.grad_clip)
    else:
        opt.init(model.trainable_parameters())
        st = Steps(model, opt, group, compute, cfg.train.grad_clip)
    mx.eval(st.state)
    m, micro = cfg.model, cfg.train.micro_batch
    rng = np.random.default_rng(rank)
    times = []
    for _ in range(steps):
        rows = rng.integers(0, m.vocab_size, (micro, m.seq_len + 1))
        x, y = mx.array(rows[:, :-1]), mx.array(rows[:, 1:])
        t0 = time.perf_counter()
        stats, local = st.fused(x, y)
        del local   # as the run loop does (Steps.run): held, it would add to the peak
        mx.eval(stats, st.state)
        times.append(time.perf_counter() - t0)
    planned = plan.estimate(cfg, micro, 1, world, shard=mode == "zero").total
    doc = {"rank": rank, "step_s": statistics.median(times[skip:]),
           "peak": mx.get_peak_memory(), "planned": planned,
           "params": plan.count_params(cfg)}
    Path(f"{out}.{rank}").write_text(json.dumps(doc))


def _run(args, mode: str, tmp: Path, config: str) -> list[dict]:
    out = tmp / mode
    cmd = [sys.executable, __file__, "--as-rank", mode, "--config", config,
           "--steps", str(args.steps), "--skip", str(args.skip), "--out", str(out),
           "--sweep-to", str(args.sweep_to)]
    proc = run_ranks(cmd, args.ranks, cwd=ROOT, timeout=1200,
                     env={**os.environ, "PYTHONPATH": os.pathsep.join(
                         [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])})
    if proc.returncode:
        sys.exit(f"{mode} run failed:\n{proc.stderr[-3000:]}")
    return [json.loads(Path(f"{out}.{r}").read_text()) for r in range(args.ranks)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--dims", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--micro", type=int, default=2)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--skip", type=int, default=5)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--sweep-to", type=int, default=64 << 20,
                   help="the sweep's largest size, bytes (from 4 KiB, powers of two)")
    p.add_argument("--save", help="write the sweep, its fits and the gather alone here")
    p.add_argument("--as-rank")
    p.add_argument("--config")
    p.add_argument("--out")
    args = p.parse_args()
    if args.as_rank:
        rank_main(args.as_rank, args.config, args.steps, args.skip, args.out, args.sweep_to)
        return
    from mlxops.bench.results import all_gather_us, allreduce_rows, fit, gather_factor

    config = json.dumps(_config(args))
    with tempfile.TemporaryDirectory(prefix="mlxops-zero-bench-") as d:
        tmp = Path(d)
        swept = _run(args, "sweep", tmp, config)   # as the bench: the slowest rank's
        rows = allreduce_rows([r["results"] for r in swept], args.ranks)
        gathers = allreduce_rows([r["all_gather"] for r in swept], args.ranks, gather_factor)
        info = {"ranks": args.ranks, "fit": fit(rows), "all_gather_fit": fit(gathers)}
        got: dict[str, list[list[dict]]] = {"plain": [], "zero": []}
        for _ in range(args.repeat):
            for mode in ("plain", "zero"):
                got[mode].append(_run(args, mode, tmp, config))
    step = {m: statistics.median(r[0]["step_s"] for r in runs) for m, runs in got.items()}
    p_count = got["plain"][0][0]["params"]
    nbytes = swept[0]["gather_bytes"]  # every rank's padded slice, in the run's dtype
    predicted = all_gather_us(info, nbytes, args.ranks) / 1e6
    before = all_gather_us({**info, "all_gather_fit": None}, nbytes, args.ranks) / 1e6
    extra = step["zero"] - step["plain"]
    gather = max(r["gather_us"] for r in swept) / 1e6
    if args.save:
        Path(args.save).write_text(json.dumps({
            "ranks": args.ranks, "dtype": args.dtype, "params": p_count, **info,
            "allreduce": [asdict(r) for r in rows], "all_gather": [asdict(r) for r in gathers],
            "gather_bytes": nbytes, "gather_us": gather * 1e6,
            "step_s": step}, indent=1) + "\n")
    for name, params in (("all_sum", info["fit"]), ("all_gather", info["all_gather_fit"])):
        print(f"bench {name} fit: a={params['a_us']:.0f} us, "
              f"b={params['b_us_per_byte'] * 1e3:.3f} us/KB")
    print(f"{args.ranks} ranks, {args.dtype}, {p_count:,} parameters, micro {args.micro} x "
          f"seq {args.seq}")
    print(f"step: unsharded {step['plain'] * 1e3:.1f} ms, sharded {step['zero'] * 1e3:.1f} ms"
          f" ({step['zero'] / step['plain']:.2f}x); extra {extra * 1e3:.1f} ms, all_gather "
          f"predicted {predicted * 1e3:.1f} ms (measured/predicted {extra / predicted:.2f})")
    print(f"all_gather of the weights alone ({nbytes / 1e6:.1f} MB): measured "
          f"{gather * 1e3:.1f} ms; predicted {predicted * 1e3:.1f} ms from the all_gather "
          f"sweep (measured/predicted {gather / predicted:.2f}), {before * 1e3:.1f} ms from "
          f"the all-reduce's (measured/predicted {gather / before:.2f})")
    for mode, runs in got.items():
        peak = max(r["peak"] for run in runs for r in run)
        planned = runs[0][0]["planned"]
        print(f"memory {mode:5}: peak {peak / 2**20:.1f} MiB per rank, plan "
              f"{planned / 2**20:.1f} MiB (plan/measured {planned / peak:.2f})")


if __name__ == "__main__":
    main()
