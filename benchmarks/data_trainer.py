"""Benchmark the trainer's data path: tokens/s on token shards against synthetic data.

The trainer part of the data benchmark (issue 19: "reading data must not show in the step
time", target at least 0.98x; ``benchmarks/data.py`` measures ``mlxops data prepare``).
One run of this script trains the same model at the same config on three sources, in
turn, ``--repeat`` times each in ABBA order (a load that drifts during the runs favours
none of them):

- ``synthetic``: the synthetic corpus, made in the step (or read ahead: ``data.prefetch``
  is on for every source);
- ``shards``: a prepared directory of uint16 token shards (the synthetic chain's tokens,
  written in the format of mlxops/trainer/shardformat.py, ``--shard-tokens`` a shard),
  memory-mapped, with read-ahead (``data.prefetch: 2``, the default);
- ``shards-inline``: the same shards read in the step (``data.prefetch: 0``), to show what
  read-ahead hides.

Beside the runs, what a step's data costs the training loop on its own (``--loop-steps``
steps in this process, no model): the CPU time of the loop's thread to get one rank's
rows of a step, median, for the synthetic source, the shards read in the loop, and the
shards from the read-ahead thread while the loop sleeps ``--loop-compute-ms`` a step as
if computing. On a shared machine the runs' tokens/s move with the load; this figure
barely does.

Each is timed as benchmarks/trainer.py times its runs: global tokens over the wall time
from the end of step ``--from`` to the end of the last step, from rank 0's metrics lines;
figures are medians. Ranks run on this machine (mlxops/devtools/local_ranks.py).

    python benchmarks/data_trainer.py                    # 1 and 2 ranks
    python benchmarks/data_trainer.py --ranks 1 --dims 512 --layers 8 --repeat 5
"""

from __future__ import annotations

import argparse
import hashlib
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
from mlxops.trainer.data import SyntheticSource  # noqa: E402
from mlxops.trainer.shardformat import (  # noqa: E402
    MANIFEST,
    Manifest,
    ShardInfo,
    TokenizerInfo,
    dtype_for,
    header,
    shard_name,
    write_tokens,
)

SOURCES = ("synthetic", "shards", "shards-inline")


def write_corpus(directory: Path, vocab: int, tokens: int, per_shard: int) -> Path:
    """``tokens`` of the synthetic chain as shards of ``per_shard`` tokens, and a manifest."""
    directory.mkdir(parents=True, exist_ok=True)
    dtype = dtype_for(vocab)
    chain = SyntheticSource(0, vocab, 1023).samples(0, tokens // 1024 + 1).ravel()[:tokens]
    infos = []
    for i, at in enumerate(range(0, tokens, per_shard)):
        path = directory / shard_name("train", i)
        with open(path, "wb") as fh:
            fh.write(header(dtype, len(chain[at:at + per_shard])))
            write_tokens(fh, chain[at:at + per_shard], dtype)
        data = path.read_bytes()
        infos.append(ShardInfo(path.name, hashlib.sha256(data).hexdigest(), len(data),
                               len(chain[at:at + per_shard])))
    manifest = Manifest(tokenizer=TokenizerInfo("bytes", "synthetic chain", "0" * 64),
                        vocab_size=vocab, dtype=dtype, train=infos, val=[])
    (directory / MANIFEST).write_text(manifest.text())
    return directory


def run_one(args: argparse.Namespace, tmp: Path, corpus: Path, ranks: int, source: str,
            i: int) -> float:
    """Tokens/s of one run."""
    data = {"source": "synthetic", "seed": 0} if source == "synthetic" else \
        {"source": "shards", "path": str(corpus), "seed": 0,
         "prefetch": 0 if source == "shards-inline" else 2}
    out = tmp / f"{source}-{ranks}-{i}"
    cfg = {"model": {"dims": args.dims, "layers": args.layers, "heads": args.heads,
                     "vocab_size": args.vocab, "seq_len": args.seq_len},
           "data": data,
           "train": {"steps": args.steps, "global_batch": args.global_batch,
                     "micro_batch": args.global_batch // ranks, "lr": 1e-3, "warmup": 5,
                     "checkpoint_every": 0, "log_every": args.log_every},
           "out": str(out)}
    path = out.with_suffix(".json")
    path.write_text(json.dumps(cfg))
    cmd = [sys.executable, "-m", "mlxops.trainer", "--config", str(path)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if ranks == 1:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env,
                              timeout=args.timeout, stdin=subprocess.DEVNULL)
    else:
        proc = run_ranks(cmd, ranks, env=env, cwd=ROOT, timeout=args.timeout)
    if proc.returncode:
        sys.exit(f"{source} ranks={ranks}: failed:\n{proc.stderr[-2000:]}")
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    at = {r["step"]: r["time"] for r in recs}
    tokens = args.global_batch * args.seq_len
    return tokens * (args.steps - args.start) / (at[args.steps] - at[args.start])


def loop_costs(args: argparse.Namespace, corpus: Path, per_rank: int) -> dict[str, float]:
    """Microseconds of the loop thread's CPU to get a step's rows, median (see above)."""
    from mlxops.trainer.data import Batches
    from mlxops.trainer.prefetch import Prefetcher
    from mlxops.trainer.shards import ShardSource

    shards = ShardSource(str(corpus), 0, args.vocab, args.seq_len)
    synthetic = SyntheticSource(0, args.vocab, args.seq_len)
    out = {}
    for name, source, depth in (("synthetic", synthetic, 0), ("shards-inline", shards, 0),
                                ("shards", shards, 2)):
        batches = Batches(source, args.global_batch, 0, args.global_batch // per_rank)
        ahead = Prefetcher(source.samples, batches.plan, depth)
        costs = []
        for step in range(1, args.loop_steps + 1):
            t0 = time.thread_time()
            ahead.rows(step)
            costs.append(time.thread_time() - t0)
            time.sleep(args.loop_compute_ms / 1e3)
        ahead.close()
        out[name] = statistics.median(costs[5:]) * 1e6
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", default="1,2", help="world sizes, comma-separated")
    p.add_argument("--dims", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=4096, help="vocabulary (uint16 shards)")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--global-batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--from", dest="start", type=int, default=20,
                   help="time from the end of this step (compilation and warm-up before)")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--repeat", type=int, default=3, help="runs of each source (ABBA order)")
    p.add_argument("--shard-tokens", type=int, default=1 << 20, help="tokens per shard")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--loop-steps", type=int, default=200)
    p.add_argument("--loop-compute-ms", type=float, default=20.0)
    p.add_argument("--no-runs", action="store_true", help="only the loop's data costs")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = p.parse_args()
    if args.start % args.log_every or args.steps % args.log_every:
        sys.exit("--from and --steps must be multiples of --log-every")
    # Enough tokens for one epoch of the run, in several shards: reads cross shards.
    tokens = max(args.steps * args.global_batch * (args.seq_len + 1), 3 * args.shard_tokens)
    results = []
    with tempfile.TemporaryDirectory(prefix="mlxops-bench-data-") as d:
        tmp = Path(d)
        corpus = write_corpus(tmp / "corpus", args.vocab, tokens, args.shard_tokens)
        loop = {ranks: loop_costs(args, corpus, args.global_batch // ranks)
                for ranks in (int(r) for r in args.ranks.split(","))}
        for ranks in (int(r) for r in args.ranks.split(",")) if not args.no_runs else ():
            got: dict[str, list[float]] = {s: [] for s in SOURCES}
            for i in range(args.repeat):
                order = SOURCES if i % 2 == 0 else tuple(reversed(SOURCES))
                for source in order:
                    got[source].append(run_one(args, tmp, corpus, ranks, source, i))
            med = {s: statistics.median(v) for s, v in got.items()}
            results.append({"ranks": ranks, "tokens_per_sec": med, "runs": got,
                            "shards_vs_synthetic": med["shards"] / med["synthetic"],
                            "inline_vs_synthetic": med["shards-inline"] / med["synthetic"]})
    if args.json:
        print(json.dumps({"config": vars(args), "results": results, "loop_us": loop},
                         indent=1))
        return
    print("the loop's CPU to get one rank's rows of a step (us, median): " + "; ".join(
        f"ranks={r}: " + ", ".join(f"{k} {v:.0f}" for k, v in costs.items())
        for r, costs in loop.items()))
    if not results:
        return
    print(f"dims {args.dims} x {args.layers} layers, seq {args.seq_len}, global batch "
          f"{args.global_batch}, vocab {args.vocab}; steps {args.start + 1}..{args.steps}, "
          f"median of {args.repeat}")
    print(f"{'ranks':>5} {'synthetic':>11} {'shards':>11} {'ratio':>6} "
          f"{'no prefetch':>12} {'ratio':>6}   tokens/s")
    for r in results:
        t = r["tokens_per_sec"]
        print(f"{r['ranks']:>5} {t['synthetic']:>11,.0f} {t['shards']:>11,.0f} "
              f"{r['shards_vs_synthetic']:>6.3f} {t['shards-inline']:>12,.0f} "
              f"{r['inline_vs_synthetic']:>6.3f}")


if __name__ == "__main__":
    main()
