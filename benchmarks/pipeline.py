"""Pipeline stages (mlxops/trainer/pipeline.py): each stage's measured peak against its
plan (mlxops/trainer/stages.py), and the pipeline's efficiency, at 2 and 3 stages.

Each run is the bundled trainer's model trained by the pipeline step on local ring ranks
(mlxops/devtools/local_ranks.py), one rank a stage, each pinned to its own cores with
``taskset`` (``--cores N`` a rank; the machine must have ranks x N) so that stages do not
share cores. Every rank measures, one rank at a time while the others wait:

- **compute**: one micro-batch's forward and backward of its stage alone (``mx.vjp`` of
  the stage on a random input and cotangent), the median of 5;
- **link**: (ranks 0 and 1) an activation sent and sent back, half the median round trip;
- **step**: the median wall time of the pipeline's steps (gradients and AdamW update);
- **peak**: MLX's allocator's peak (``mx.get_peak_memory()``) since the rank started.

The schedule's ideal is :func:`mlxops.trainer.schedule.step_seconds` of the measured
compute and link times; **efficiency** is ideal / measured step. The plan's figure is
:func:`mlxops.trainer.stages.stage_peak` of the stage's layers.

    python benchmarks/pipeline.py                    # 2 and 3 stages, 1 core a rank
    python benchmarks/pipeline.py --cores 4 --stages 2 3 --micro 8
    python benchmarks/pipeline.py --finetune       # mlx-lm's llama with LoRA instead
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODEL = {"dims": 256, "layers": 6, "heads": 4, "vocab_size": 2048, "seq_len": 128,
         "tie_embeddings": False}


#: The fine-tuning model (``--finetune``): mlx-lm's llama, random weights, LoRA rank 8 on
#: every linear layer of every block.
LLAMA = {"hidden_size": 256, "num_hidden_layers": 6, "intermediate_size": 704,
         "num_attention_heads": 8, "num_key_value_heads": 4}


def finetune_stage(opts: dict, group):
    """``(model, stage, step, its StagePlan, batches)`` of this rank for ``--finetune``."""
    import mlx.core as mx
    import numpy as np

    from mlxops.finetune import pipeline as fp
    from mlxops.finetune import plan
    from mlxops.finetune.config import load_config
    from mlxops.finetune.stageplan import finetune_costs, read_ends
    from mlxops.trainer import pipeline, stages

    rank, size = group.rank(), group.size()
    path, seq = opts["finetune"], opts["model"]["seq_len"]
    cfg = load_config({"model": {"path": path}, "data": {"path": "unused"},
                       "method": {"type": "lora", "num_layers": -1, "rank": 8},
                       "train": {"max_seq_len": seq}})
    costs = finetune_costs(plan.read_model(path), read_ends(path), cfg, opts["size"])
    plans = stages.split(costs, [1 << 40] * size, opts["micro"])
    mine = plans[rank]
    first, last = rank == 0, rank == size - 1
    model, config, _ = fp.load_stage(path, mine.start, mine.stop, first, last)
    fp.apply_stage_method(model, cfg, len(costs.layers), mine.start, mine.stop)
    fp.init_adapters(model, 0, mine.start)
    stage = fp.FinetuneStage(model, config, mine.start, first, last)
    step = pipeline.PipelineStep(stage, group, rank, size, first_backward=fp.first_trained_stage(
        [p.layers for p in plans], -1))
    vocab = int(config["vocab_size"])

    def batches(s: int) -> list:
        out = []
        for k in range(opts["micro"]):
            rng = np.random.default_rng([s, k])
            tokens = mx.array(rng.integers(0, vocab, (opts["size"], seq + 1)), dtype=mx.int32)
            out.append((tokens, mx.array([[1, seq]] * opts["size"], dtype=mx.int32)))
        return out

    return model, stage, step, mine, batches


def rank_main(out: Path, opts: dict) -> None:
    import mlx.core as mx
    import mlx.optimizers as optim
    import numpy as np

    from mlxops.finetune import pipeline as fp
    from mlxops.trainer import pipeline, stages
    from mlxops.trainer.config import load_config
    from mlxops.trainer.schedule import step_seconds
    from mlxops.trainer.stagemodel import StageModel, TrainerStage

    if opts.get("cpu"):
        mx.set_default_device(mx.cpu)
    group = mx.distributed.init(strict=True)
    rank, size = group.rank(), group.size()
    first, last = rank == 0, rank == size - 1
    if opts.get("finetune"):
        model, stage, step, mine, batches = finetune_stage(opts, group)
        opt = optim.Adam(learning_rate=1e-4)

        def update(grads: dict) -> None:
            local = {fp.to_local(k, mine.start): v for k, v in grads.items()}
            pipeline.update(model, opt, local)
    else:
        cfg = load_config({"model": opts["model"], "train": {
            "global_batch": opts["micro"] * opts["size"], "micro_batch": opts["size"]}})
        m = cfg.model
        costs = stages.trainer_costs(cfg, opts["size"], opts["micro"])
        mine = stages.split(costs, [1 << 40] * size, opts["micro"])[rank]
        model = StageModel(m, mine.start, mine.stop, first, last, seed=0)
        opt = optim.AdamW(learning_rate=1e-3)
        stage = TrainerStage(model, m.dims)
        step = pipeline.PipelineStep(stage, group, rank, size)

        def batches(s: int) -> list:
            out = []
            for k in range(opts["micro"]):
                rng = np.random.default_rng([s, k])
                x = mx.array(rng.integers(0, m.vocab_size, (opts["size"], m.seq_len + 1)),
                             dtype=mx.int32)
                out.append((x[:, :-1], x[:, 1:]))
            return out

        def update(grads: dict) -> None:
            pipeline.update(model, opt, grads)

    def barrier() -> None:
        mx.eval(mx.distributed.all_sum(mx.array(1.0), group=group, stream=mx.cpu))

    times = []
    for s in range(opts["warmup"] + opts["steps"]):
        barrier()
        t0 = time.perf_counter()
        _, grads = step.gradients(batches(s))
        update(grads)
        mx.eval(model.parameters(), opt.state)
        barrier()
        if s >= opts["warmup"]:
            times.append(time.perf_counter() - t0)
    peak = mx.get_peak_memory()

    # Compute alone, one rank at a time.
    batch = batches(0)[0]
    shape, dtype = stage.boundary(batch)
    params = stage.trainable()
    names = list(params)
    compute = None
    for r in range(size):
        barrier()
        if r == rank:
            x = None if first else mx.random.normal(shape, dtype=dtype)
            cot = mx.array(1.0) if last else mx.random.normal(shape, dtype=dtype)
            mx.eval(x, cot)

            def fn(*flat, x=x):
                return stage.forward(dict(zip(names, flat[:len(names)], strict=True)),
                                     flat[len(names)] if x is not None else None, batch)

            primals = [params[k] for k in names] + ([] if x is None else [x])
            runs = []
            for _ in range(6):
                t0 = time.perf_counter()
                mx.eval(mx.vjp(fn, primals, [cot]))
                runs.append(time.perf_counter() - t0)
            compute = statistics.median(runs[1:])
        barrier()
    # The link between ranks 0 and 1, an activation there and back.
    link = None
    if rank in (0, 1):
        a = mx.random.normal(shape, dtype=dtype)
        mx.eval(a)
        rounds = []
        for _ in range(8):
            t0 = time.perf_counter()
            if rank == 0:
                mx.eval(mx.distributed.send(a, 1, group=group))
                mx.eval(mx.distributed.recv_like(a, 1, group=group))
            else:
                b = mx.distributed.recv_like(a, 0, group=group)
                mx.eval(b)
                mx.eval(mx.distributed.send(b, 0, group=group))
            rounds.append(time.perf_counter() - t0)
        link = statistics.median(rounds[1:]) / 2
    barrier()
    gathered = mx.distributed.all_gather(mx.array([[compute, link or 0.0]]), group=group,
                                         stream=mx.cpu).tolist()
    computes = [row[0] for row in gathered]
    link_s = gathered[1][1] if size > 1 else 0.0
    ideal = step_seconds(computes, opts["micro"], link_s)
    measured = statistics.median(times)
    (out / f"rank-{rank}.json").write_text(json.dumps({
        "rank": rank, "layers": [mine.start, mine.stop], "plan": mine.peak, "peak": peak,
        "compute_s": compute, "link_s": link_s, "step_s": measured, "ideal_s": ideal,
        "in_flight": mine.in_flight}))


def run(stages: int, cores: int, opts: dict) -> list[dict]:
    from mlxops.devtools.local_ranks import run_ranks

    with tempfile.TemporaryDirectory(prefix="mlxops-pipebench-") as d:
        pin = (f'exec taskset -c $((MLX_RANK*{cores}))-$((MLX_RANK*{cores}+{cores}-1)) '
               f'"{sys.executable}" "{__file__}" --rank "{d}" \'{json.dumps(opts)}\'')
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = run_ranks(["sh", "-c", pin], stages, env=env, timeout=1200)
        if proc.returncode:
            sys.exit(proc.stderr[-3000:])
        return [json.loads((Path(d) / f"rank-{r}.json").read_text()) for r in range(stages)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stages", type=int, nargs="+", default=[2, 3])
    p.add_argument("--cores", type=int, default=1, help="cores a rank (taskset)")
    p.add_argument("--micro", type=int, default=8, help="micro-batches a step")
    p.add_argument("--size", type=int, default=4, help="sequences a micro-batch")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--layers", type=int, default=MODEL["layers"])
    p.add_argument("--dims", type=int, default=MODEL["dims"])
    p.add_argument("--seq-len", type=int, default=MODEL["seq_len"])
    p.add_argument("--cpu", action="store_true", help="mx.cpu even where a GPU is")
    p.add_argument("--finetune", action="store_true",
                   help="fine-tune mlx-lm's llama (LoRA) instead of the bundled trainer")
    p.add_argument("--rank", nargs=2, metavar=("OUT", "OPTS"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank:
        rank_main(Path(args.rank[0]), json.loads(args.rank[1]))
        return
    model = {**MODEL, "layers": args.layers, "dims": args.dims, "seq_len": args.seq_len}
    opts = {"model": model, "micro": args.micro,
            "size": args.size, "steps": args.steps, "warmup": 2, "cpu": args.cpu}
    if args.finetune:
        from mlxops.devtools.tinymodels import build_model

        tmp = tempfile.mkdtemp(prefix="mlxops-pipebench-model-")
        opts["finetune"] = str(build_model(Path(tmp) / "llama", "llama",
                                           sizes={**LLAMA, "num_hidden_layers": args.layers}))
    what = f"llama {LLAMA}, LoRA" if args.finetune else f"model {opts['model']}"
    print(f"{what}, {args.micro} micro-batches of {args.size} sequences, "
          f"{args.cores} core(s) a rank, load {os.getloadavg()[0]:.2f} before")
    try:
        for s in args.stages:
            rows = run(s, args.cores, opts)
            print(f"\n{s} stages")
            print(f"{'stage':>5} {'layers':>7} {'plan MiB':>9} {'peak MiB':>9} {'plan/peak':>9} "
                  f"{'compute ms':>10}")
            for r in rows:
                print(f"{r['rank']:>5} {r['layers'][0]:>3}-{r['layers'][1] - 1:<3} "
                      f"{r['plan'] / 2**20:>9.1f} {r['peak'] / 2**20:>9.1f} "
                      f"{r['plan'] / r['peak']:>9.2f} {r['compute_s'] * 1e3:>10.1f}")
            r = rows[0]
            print(f"link {r['link_s'] * 1e3:.2f} ms, step {r['step_s'] * 1e3:.1f} ms, schedule's "
                  f"ideal {r['ideal_s'] * 1e3:.1f} ms, efficiency {r['ideal_s'] / r['step_s']:.2f}"
                  f" (load {os.getloadavg()[0]:.2f} after)")

    finally:
        if args.finetune:
            shutil.rmtree(tmp, ignore_errors=True)

if __name__ == "__main__":
    main()
