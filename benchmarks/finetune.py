"""Benchmark fine-tuning: our loop's tokens/s against ``mlx_lm.lora``'s own, same run.

Both train the same LoRA on the same model and data, with the same global batch, maximum
sequence length, optimizer and learning rate, at each of ``--ranks`` world sizes, in ABBA
order ``--repeat`` times (ours, theirs, theirs, ours, ...), one after the other on this
machine:

- ours: ``python -m mlxops.finetune`` (its ``metrics.jsonl``);
- the anchor: mlx-lm's own training code, as ``mlx_lm.lora`` runs it (``load``,
  ``load_dataset``, ``train_model``: mlx-lm's ``train`` loop with its compiled step and
  ``average_gradients``), with a ``TrainingCallback`` recording the reports ``mlx_lm.lora``
  prints (this file run with ``--anchor CONFIG``).

Ranks are started as mlx.launch starts them but without its launcher
(mlxops/devtools/local_ranks.py), for both: mlx.launch's I/O loop spins a core, a third of
this 2-core machine. On Linux both get this machine's OpenBLAS preloaded as mlxops
preloads it into ranks (``LD_PRELOAD``, ``OPENBLAS_NUM_THREADS`` = usable CPUs // ranks
and its short idle spin: docs/job-file.md, "What each rank gets"), where there is one.
Neither validates (``eval_every 0``; mlx-lm's ``val_batches 0`` excludes its validation
time from its figure anyway).

Every batch is ``--max-seq-len`` tokens wide in both loops (mlx-lm pads a batch to
``1 + 32k`` tokens, capped at the maximum: with the default 33, every batch is 33 wide), so
every step does the same work, and a step's tokens are ``batch x max_seq_len``, padding
included. (The tokens the loss counts would mislead: our batches are sorted by length,
mlx-lm's are not, whose sort is by ``len()`` of the raw item, so a window of our short
examples counts fewer tokens for the same work, and one of our long ones more.) Each loop
reports its own steps per second over windows of ``--report`` steps (ours:
``metrics.jsonl``'s ``step_time``; mlx-lm's: ``iterations_per_second``, its training time
without its data loading); the first window (compilation) is left out. A run's figure is
its fastest window: on a shared machine (this one runs other people's tests at a load of
15-35 on 2 cores) other processes only ever add time to a window, so the fastest is the
nearest to the loop's own cost (the trainer's ``balance: auto`` takes its fastest step for
the same reason); the median window is printed beside it. A configuration's figure is the
median of its runs.

    python benchmarks/finetune.py                      # ranks 1,2; llama 128 wide, 2 blocks
    python benchmarks/finetune.py --ranks 1 --steps 60 --hidden 512
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mlxops.devtools.local_ranks import openblas_env, run_ranks  # noqa: E402 - after the path
from mlxops.devtools.tinymodels import build_model, write_dataset  # noqa: E402
from mlxops.node.blas import find_openblas  # noqa: E402


def anchor(config_file: str) -> int:
    """One rank of mlx-lm's own loop, as ``mlx_lm.lora --train`` runs it."""
    import mlx.core as mx
    from mlx_lm.lora import CONFIG_DEFAULTS, train_model
    from mlx_lm.tuner.callbacks import TrainingCallback
    from mlx_lm.tuner.datasets import load_dataset
    from mlx_lm.utils import load

    spec = json.loads(Path(config_file).read_text())
    args = types.SimpleNamespace(**{**CONFIG_DEFAULTS, **spec["args"]})
    reports = Path(spec["reports"])

    class Record(TrainingCallback):
        def on_train_loss_report(self, info: dict) -> None:
            if mx.distributed.init().rank() == 0:
                with open(reports, "a") as f:
                    f.write(json.dumps(info) + "\n")

    mx.random.seed(args.seed)
    model, tokenizer = load(args.model)
    train_set, valid_set, _ = load_dataset(args, tokenizer)
    train_model(args, model, train_set, valid_set, Record())
    return 0


def run(cmd: list[str], ranks: int, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    library = find_openblas() if sys.platform.startswith("linux") else None
    if library:
        env.update(openblas_env(library, ranks))
    if ranks > 1:
        proc = run_ranks(cmd, ranks, env=env, cwd=ROOT, timeout=timeout)
    else:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT,
                              timeout=timeout, stdin=subprocess.DEVNULL)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd[:4])}... failed:\n{proc.stdout[-2000:]}"
                         f"{proc.stderr[-2000:]}")
    return proc


def ours(tmp: Path, model: Path, data: Path, a: argparse.Namespace, ranks: int, n: int
         ) -> list[float]:
    out = tmp / f"ours-{ranks}-{n}"
    config = {
        "model": {"path": str(model)}, "data": {"path": str(data)},
        "method": {"type": "lora", "rank": 8, "scale": 20.0, "num_layers": -1},
        "train": {"steps": a.steps, "global_batch": a.batch, "max_seq_len": a.max_seq_len,
                  "log_every": a.report, "eval_every": 0, "checkpoint_every": 0, "seed": 0,
                  "micro_batch": a.batch, "optimizer": "adamw", "lr": 1e-4,
                  "weight_decay": 0.01},
        "out": str(out),
    }
    path = tmp / f"ours-{ranks}-{n}.json"
    path.write_text(json.dumps(config))
    run([sys.executable, "-m", "mlxops.finetune", "--config", str(path)], ranks, a.timeout)
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [a.batch * a.max_seq_len / x["step_time"] for x in lines[1:]]


def theirs(tmp: Path, model: Path, data: Path, a: argparse.Namespace, ranks: int, n: int
           ) -> list[float]:
    reports = tmp / f"theirs-{ranks}-{n}.jsonl"
    spec = {"reports": str(reports), "args": {
        "model": str(model), "data": str(data), "train": True, "fine_tune_type": "lora",
        "optimizer": "adamw", "optimizer_config": {"adamw": {"weight_decay": 0.01}},
        "num_layers": -1, "lora_parameters": {"rank": 8, "scale": 20.0, "dropout": 0.0},
        "batch_size": a.batch, "iters": a.steps, "learning_rate": 1e-4,
        "max_seq_length": a.max_seq_len, "steps_per_report": a.report,
        "steps_per_eval": a.steps * 10, "val_batches": 0, "save_every": a.steps * 10,
        "adapter_path": str(tmp / f"theirs-{ranks}-{n}"), "seed": 0}}
    path = tmp / f"theirs-{ranks}-{n}.json"
    path.write_text(json.dumps(spec))
    run([sys.executable, str(Path(__file__).resolve()), "--anchor", str(path)], ranks,
        a.timeout)
    lines = [json.loads(x) for x in reports.read_text().splitlines()]
    return [a.batch * a.max_seq_len * x["iterations_per_second"] for x in lines[1:]]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", default="1,2", help="world sizes, comma separated")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--report", type=int, default=5, help="steps per report window")
    p.add_argument("--batch", type=int, default=8, help="global batch (examples)")
    p.add_argument("--max-seq-len", type=int, default=33,
                   help="at most 33: every batch is then this wide in both loops")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--repeat", type=int, default=1,
                   help="ABBA groups (ours, theirs, theirs, ours) per world size")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--anchor", metavar="CONFIG", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.anchor:
        return anchor(a.anchor)
    if a.max_seq_len > 33:
        p.error("--max-seq-len: at most 33 (every batch that wide in both loops)")
    with tempfile.TemporaryDirectory(prefix="mlxops-ft-bench-") as d:
        tmp = Path(d)
        model = build_model(tmp / "model", "llama", sizes={
            "hidden_size": a.hidden, "num_hidden_layers": a.layers,
            "intermediate_size": 4 * a.hidden, "num_attention_heads": max(1, a.hidden // 32),
            "num_key_value_heads": max(1, a.hidden // 64)})
        data = write_dataset(tmp / "data", "chat")
        print(f"llama {a.hidden} wide, {a.layers} blocks; LoRA rank 8 on every linear layer; "
              f"chat data; global batch {a.batch}, max_seq_len {a.max_seq_len}, {a.steps} "
              f"steps, windows of {a.report} (first left out); ABBA x {a.repeat}")
        blas = find_openblas() if sys.platform.startswith("linux") else None
        print(f"BLAS: {blas or 'the one in the mlx wheel'}")
        print(f"{'ranks':>5} {'ours tok/s':>11} {'mlx_lm.lora tok/s':>18} {'ratio':>6} "
              f"{'median-window ratio':>20}  runs (fastest windows)")
        for ranks in [int(r) for r in a.ranks.split(",")]:
            runs: dict[object, list[list[float]]] = {ours: [], theirs: []}
            for n in range(a.repeat):
                first, second = (ours, theirs) if n % 2 == 0 else (theirs, ours)
                for fn in (first, second, second, first):
                    done = len(runs[ours]) + len(runs[theirs])
                    runs[fn].append(fn(tmp, model, data, a, ranks, done))
            mine = [max(r) for r in runs[ours]]
            anchors = [max(r) for r in runs[theirs]]
            ratio = statistics.median(mine) / statistics.median(anchors)
            typical = (statistics.median(statistics.median(r) for r in runs[ours])
                       / statistics.median(statistics.median(r) for r in runs[theirs]))
            print(f"{ranks:>5} {statistics.median(mine):>11.0f} "
                  f"{statistics.median(anchors):>18.0f} {ratio:>6.2f} {typical:>20.2f}  ours "
                  f"{[round(x) for x in mine]}, theirs {[round(x) for x in anchors]}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
