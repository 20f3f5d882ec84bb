"""The bundled trainer against a plain bfloat16 mlx-lm loop on a GPU, and the memory plan
against the peak measured there (issue 33's table).

For each row (model dims/layers/heads, seq_len, batch) and dtype: the bundled trainer
(``Trainer.run()``, one rank, synthetic corpus, accumulation 1) and a plain mlx-lm-style
loop (mlx-lm's ``llama`` at the same shape, ``mlx.optimizers.AdamW`` with the trainer's
schedule, one ``mx.compile`` over model and optimizer state; in bfloat16 everything,
moments included, is bfloat16) run ``--steps`` steps each, one fresh process per run
(gpu_runs.py). tokens/s is the median step after ``--skip``; the ratio is ours over the
loop's; plan / peak is the trainer's memory plan for the backend it ran on
(mlxops/trainer/plan.py) over ``mx.get_peak_memory()`` of its run. ``--repeat`` runs the
table again, each pair in the other order (ABBA), for the spread.

On a CUDA machine (MLX's CUDA build: ``pip install mlx-cuda-13==<mlx's version>``
``mlx-lm``; /work/shared/GPU.md says how to bring it to a machine with no network)::

    python benchmarks/gpu_bf16.py                      # the four rows of issue 33
    python benchmarks/gpu_bf16.py --json $OUT/bf16.json --repeat 2
    python benchmarks/gpu_bf16.py --dtypes bfloat16 --rows 2048/16/16/1024/8

Here on a CPU, to check the script itself (figures meaningless)::

    python benchmarks/gpu_bf16.py --tiny
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_runs import Row, measure  # noqa: E402 - after the path

#: Issue 33's rows: dims/layers/heads/seq_len/batch.
ROWS = ["1024/8/16/512/16", "2048/16/16/1024/8"]
TINY = ["64/2/4/32/4", "96/2/4/64/2"]
GB = 1e9


def parse_row(text: str, dtype: str) -> Row:
    dims, layers, heads, seq_len, batch = (int(x) for x in text.split("/"))
    return Row(dims, layers, heads, seq_len, batch, dtype)


def plan_ratio(result: dict) -> float | None:
    plan = result.get("plan", {})
    planned = plan.get(result["backend"], plan.get("any"))
    return planned / result["peak"] if planned else None


def line(ours: dict, loop: dict) -> str:
    row = Row(**ours["row"])
    if "error" in ours or "error" in loop:
        failed = ours if "error" in ours else loop
        return f"| {row.label()} | {row.dtype} | failed: {failed['error'][-300:]!r} |"
    ratio = plan_ratio(ours)
    return (f"| {row.label()} | {row.dtype} | {ours['tok_s'] / 1e3:.1f}k | "
            f"{loop['tok_s'] / 1e3:.1f}k | {ours['tok_s'] / loop['tok_s']:.2f} | "
            f"{ours['step_ms']:.1f} / {loop['step_ms']:.1f} | "
            f"{ours['peak'] / GB:.2f} / {loop['peak'] / GB:.2f} | "
            f"{'-' if ratio is None else f'{ratio:.2f}'} |")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", nargs="+", help="dims/layers/heads/seq_len/batch (issue 33's)")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--skip", type=int, default=12, help="steps left out of the median")
    p.add_argument("--repeat", type=int, default=1, help="pairs per row (ABBA order)")
    p.add_argument("--tiny", action="store_true", help="tiny rows, to check it on a CPU")
    p.add_argument("--json", type=Path, help="write every run's record here")
    p.add_argument("--options", type=json.loads, default={},
                   help="switches of the trainer's Steps, as JSON (gpu_runs.VariantSteps)")
    a = p.parse_args()
    rows = a.rows or (TINY if a.tiny else ROWS)
    if a.tiny:
        a.steps, a.skip = min(a.steps, 8), min(a.skip, 3)
    records, lines = [], []
    header = ("| config (dims/layers/heads, seq, batch) | dtype | mlxops tok/s | loop tok/s | "
              "ratio | ms/step ours / loop | peak GB ours / loop | plan / peak |\n"
              "|---|---|---|---|---|---|---|---|")
    # Every row once, then again (the pair in the other order): a run cut short by a time
    # limit keeps whole tables, and the JSON is rewritten after every pair for that reason.
    for r in range(a.repeat):
        order = ["trainer", "loop"] if r % 2 == 0 else ["loop", "trainer"]
        for dtype in a.dtypes.split(","):
            for text in rows:
                row = parse_row(text, dtype)
                row.options = a.options
                got = {kind: measure(kind, row, a.steps, a.skip) for kind in order}
                records.extend(got.values())
                lines.append(line(got["trainer"], got["loop"]))
                print(lines[-1], flush=True)
                if a.json:
                    a.json.write_text(json.dumps(records, indent=1))
    device = next((r["backend"] for r in records if "backend" in r), "?")
    print(f"\n{a.steps} steps, median after {a.skip}; backend {device}\n{header}")
    print("\n".join(lines))
    return 0 if all("error" not in r for r in records) else 1


if __name__ == "__main__":
    raise SystemExit(main())
