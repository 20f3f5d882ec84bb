"""Fine-tuning's stage plan (mlxops/finetune/stageplan.py) against each stage's measured
peak, through the run loop a job runs (``python -m mlxops.finetune`` with
``train.stages``), beside one process holding every block (``stages: [L]``).

Each run is a LoRA (every linear of every block, dropout 0) on mlx-lm's llama with
random weights (mlxops/devtools/tinymodels.py), on local ring ranks
(mlxops/devtools/local_ranks.py), 2 steps. A rank's figure is MLX's allocator's peak
(``mx.get_peak_memory()``) when its process ends; the plan's is
:func:`mlxops.trainer.stages.plan_split` of the split, as ``mlxops plan`` gives it. The
issue's bound: the plan within 15% of the peak, never more than 10% below.

The data fills ``max_seq_len`` (rows of six docstrings of the tiny corpus joined): the
plan counts ``max_seq_len`` tokens a row, so rows shorter than that make it over-estimate
by their shortfall (``--short`` takes the one-docstring rows of the tests' text data
instead, to show it).

    python benchmarks/pipeline_finetune_memory.py                 # [3, 3] and [2, 2, 2]
    python benchmarks/pipeline_finetune_memory.py --seq-len 128 --micro-batches 2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: benchmarks/pipeline.py's fine-tuning model.
LLAMA = {"hidden_size": 256, "num_hidden_layers": 6, "intermediate_size": 704,
         "num_attention_heads": 8, "num_key_value_heads": 4}
#: Runs the module and prints its rank's MLX peak when the process ends.
PEAK = ("import atexit, os, runpy, sys, mlx.core as mx;"
        "atexit.register(lambda: print('PEAK', os.environ.get('MLX_RANK', '0'), "
        "mx.get_peak_memory(), file=sys.stderr));"
        "sys.argv = ['mlxops.finetune', '--config', sys.argv[1]];"
        "runpy.run_module('mlxops.finetune', run_name='__main__')")


def long_rows(out: Path) -> Path:
    """train/valid.jsonl of rows of six docstrings joined (longer than 128 tokens)."""
    from mlxops.devtools.tinymodels import docstring_paragraphs

    texts = [t for _, t in docstring_paragraphs()]
    rows = "".join(json.dumps({"text": " ".join(texts[i:i + 6])}) + "\n"
                   for i in range(len(texts) - 6))
    out.mkdir(parents=True)
    for name in ("train", "valid"):
        (out / f"{name}.jsonl").write_text(rows)
    return out


def peaks(tmp: Path, config: dict, ranks: int) -> dict[int, int]:
    """Each rank's MLX peak of a run of ``config``."""
    from mlxops.devtools.local_ranks import run_ranks

    path = tmp / f"run-{ranks}.json"
    path.write_text(json.dumps(config))
    env = {"PYTHONPATH": str(ROOT), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    cmd = [sys.executable, "-c", PEAK, str(path)]
    if ranks == 1:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    else:
        proc = run_ranks(cmd, ranks, env=env, timeout=1800)
    if proc.returncode:
        sys.exit(proc.stderr[-3000:])
    return {int(w[1]): int(w[2]) for w in map(str.split, proc.stderr.splitlines())
            if w and w[0] == "PEAK"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--micro", type=int, default=4, help="examples a micro-batch")
    p.add_argument("--micro-batches", type=int, default=3, help="micro-batches a step")
    p.add_argument("--splits", default="[[3, 3], [2, 2, 2]]", help="JSON list of splits")
    p.add_argument("--short", action="store_true",
                   help="the tests' text rows (one docstring, often shorter than seq-len)")
    args = p.parse_args()

    from mlxops.devtools.tinymodels import build_model, write_dataset
    from mlxops.finetune.config import from_dict
    from mlxops.finetune.plan import read_model
    from mlxops.finetune.stageplan import finetune_costs, read_ends
    from mlxops.trainer.stages import plan_split

    tmp = Path(tempfile.mkdtemp(prefix="mlxops-ftstages-"))
    try:
        model = build_model(tmp / "llama", "llama", sizes=LLAMA)
        data = write_dataset(tmp / "short", "text") if args.short else long_rows(tmp / "long")
        base = {"model": {"path": str(model)}, "data": {"path": str(data)},
                "method": {"type": "lora", "rank": 8, "num_layers": -1, "dropout": 0.0},
                "train": {"lr": 1e-3, "steps": 2, "global_batch": args.micro * args.micro_batches,
                          "micro_batch": args.micro, "max_seq_len": args.seq_len,
                          "eval_every": 0, "checkpoint_every": 100, "log_every": 1}}
        costs = finetune_costs(read_model(model), read_ends(model),
                               from_dict(base, where="benchmark"), args.micro)
        layers = LLAMA["num_hidden_layers"]
        print(f"llama {LLAMA}, LoRA rank 8, {args.micro_batches} micro-batches of "
              f"{args.micro} x {args.seq_len} tokens, load {os.getloadavg()[0]:.2f} before")
        print(f"{'split':>10} {'stage':>5} {'plan MiB':>9} {'peak MiB':>9} {'plan/peak':>9}")
        for split in [[layers]] + json.loads(args.splits):
            config = json.loads(json.dumps(base))
            config["train"]["stages"] = split
            config["out"] = str(tmp / f"out-{len(split)}")
            measured = peaks(tmp, config, len(split))
            for plan in plan_split(costs, split, [1 << 40] * len(split), args.micro_batches):
                peak = measured[plan.stage]
                print(f"{str(split):>10} {plan.stage:>5} {plan.peak / 2**20:>9.1f} "
                      f"{peak / 2**20:>9.1f} {plan.peak / peak:>9.2f}")
        print(f"load {os.getloadavg()[0]:.2f} after")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
