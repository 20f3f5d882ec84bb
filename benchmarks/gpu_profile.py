"""Where a bfloat16 step's time goes: variants of the trainer's step and of the plain loop,
timed in the same run on a GPU (issue 33).

Each variant is one fresh process (gpu_runs.py) over the same row; printed: the median
step, and where a variant splits its step (``split``), the forward/backward ("compute":
the local gradients evaluated) and the rest (the update). The trainer's variants are its
own ``Steps`` with switches (gpu_runs.VariantSteps):

- ``working_copy``: the weights' bfloat16 copy kept as state, cast by the update that made
  the float32 masters, instead of a cast of every weight at the start of each forward pass
  (the gradients then come back in bfloat16 and the update casts them);
- ``loss_bf16``: the cross-entropy over bfloat16 logits (mlx-lm's), not float32 ones;
- ``no_local``: the compiled step does not return the local gradients (which the trainer
  returns to time its compute / update split), so they need not be materialised;
- ``no_snapshot``: the loop keeps no reference to the previous state during a step (the
  trainer keeps one to undo a step that ran out of memory), so the update may write over it.

The loop's variants: mlx-lm's llama (``loop``) and the trainer's own model (``model:
mlxops``) in the plain all-bfloat16 loop: a difference between them is the model's, not the
master weights'.

    python benchmarks/gpu_profile.py                     # issue 33's two rows, bfloat16
    python benchmarks/gpu_profile.py --tiny              # on a CPU, to check the script
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_bf16 import ROWS, TINY, parse_row  # noqa: E402 - after the path
from gpu_runs import measure  # noqa: E402

#: (name, kind, options)
VARIANTS = [
    ("loop", "loop", {}),
    ("loop split", "loop", {"split": True}),
    ("loop, mlxops model", "loop", {"model": "mlxops"}),
    ("trainer", "trainer", {}),
    ("trainer split", "trainer", {"split": True}),
    ("trainer no_local", "trainer", {"no_local": True}),
    ("trainer loss_bf16", "trainer", {"loss_bf16": True}),
    ("trainer no_snapshot", "trainer", {"no_snapshot": True}),
    ("copy", "trainer", {"working_copy": True}),
    ("copy split", "trainer", {"working_copy": True, "split": True}),
    ("copy no_local", "trainer", {"working_copy": True, "no_local": True}),
    ("copy no_local no_snapshot", "trainer",
     {"working_copy": True, "no_local": True, "no_snapshot": True}),
    ("copy loss_bf16 no_local", "trainer",
     {"working_copy": True, "loss_bf16": True, "no_local": True}),
    ("copy loss_bf16 no_local no_snapshot", "trainer",
     {"working_copy": True, "loss_bf16": True, "no_local": True, "no_snapshot": True}),
]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", nargs="+")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--skip", type=int, default=10)
    p.add_argument("--only", help="comma-separated variant names")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    if a.tiny:
        a.steps, a.skip = min(a.steps, 6), min(a.skip, 2)
    only = set(a.only.split(",")) if a.only else None
    records = []
    for text in a.rows or (TINY if a.tiny else ROWS):
        base = parse_row(text, a.dtype)
        print(f"\n{base.label()} {a.dtype}: {a.steps} steps, median after {a.skip}", flush=True)
        for name, kind, options in VARIANTS:
            if only and name not in only:
                continue
            base.options = options
            r = measure(kind, base, a.steps, a.skip)
            r["variant"] = name
            records.append(r)
            if "error" in r:
                print(f"  {name:28s} failed: {r['error'][-400:]}", flush=True)
                continue
            split = (f"  compute {r['compute_ms']:.1f} + update {r['update_ms']:.1f}"
                     if "compute_ms" in r else "")
            print(f"  {name:28s} {r['step_ms']:8.2f} ms  {r['tok_s'] / 1e3:8.1f}k tok/s  "
                  f"peak {r['peak'] / 1e9:6.2f} GB{split}", flush=True)
    if a.json:
        a.json.write_text(json.dumps(records, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
