"""Fit the memory plan's CUDA terms (mlxops/trainer/plan.py) to the peaks measured on a GPU.

Reads the runs kept in ``benchmarks/gpu_data/`` (gpu_memory.py's grid, and the trainer's
runs of gpu_bf16.py / gpu_profile.py with the trainer's defaults), then for each compute
dtype fits the weights of the plan's terms by least squares on the relative error, with
every weight kept >= 0:

- the backward pass's peak above the state (12 P), over the runs without checkpointing or
  accumulation: ``g P + L w N (a_d D + a_f F + a_s H T) + w N (x_d D + x_f F + x_s H T)
  + logits N V``. In bfloat16 ``a_s = x_s = 0``: MLX's CUDA build runs attention through
  cuDNN's fused kernel there, which keeps no H x T probabilities (the peak does not grow
  with the sequence at equal tokens: 1024/8/16 at 512x16, 1024x8, 2048x4 in the grid);
  float32 takes MLX's unfused path, which materialises them as on a CPU;
- which runs peak in the update (a large model in bfloat16) and ``u`` by alternating
  (:func:`fit`);
- then ``accumulate`` and ``checkpoint``, the other weights fixed: the largest any run with
  accumulation / checkpointing needs (the plan over rather than under a peak).
  ``CHECKS`` (the final table, run with the fitted terms) is left out.

Prints the fitted terms and plan / peak for every run. Run on any machine (it measures
nothing)::

    python benchmarks/gpu_fit.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from gpu_runs import Row  # noqa: E402

from mlxops.trainer import plan  # noqa: E402
from mlxops.trainer.config import load_config  # noqa: E402

DATA = ROOT / "benchmarks" / "gpu_data"
#: Runs made with the fitted terms in plan.py, after the fit: what checks it, not fits it.
CHECKS = ("h200-final-table.json",)
#: How strongly the fit keeps the CPU's weights where the runs do not tell (relative).
REGULARISE = 0.005
MAIN = ["g", "a_d", "a_f", "a_s", "x_d", "x_f", "x_s", "logits"]


def records() -> list[dict]:
    """Every trainer run on CUDA in the data kept here that ran the trainer's step as it is
    there now: the gradients launched first, and in bfloat16 the working copy (runs record
    both; the first runs, from before, said so in their options or not at all)."""
    out = []
    for path in sorted(DATA.glob("*.json*")):
        if path.name in CHECKS:
            continue
        text = path.read_text()
        rs = [json.loads(x) for x in text.splitlines()] if path.suffix == ".jsonl" \
            else json.loads(text)
        for r in rs:
            if r.get("kind") != "trainer" or r.get("backend") != "cuda" or "peak" not in r:
                continue
            options = r["row"].get("options", {})
            copy = r.get("working_copy", options.get("working_copy", False))
            first = r.get("grads_first", options.get("grads_first", False))
            if set(options) - {"working_copy", "grads_first"}:
                continue  # a profiling variant (gpu_profile.py)
            if not first or (r["row"]["dtype"] == "bfloat16" and not copy):
                continue  # a step as it was before (gpu_data/README.md)
            out.append({**r, "source": path.name})
    return out


def shape(r: dict) -> dict:
    row = Row(**r["row"])
    cfg = load_config(row.config(6, "x"))
    m = cfg.model
    micro, acc = r["micro"], r["accumulation"]
    n, w = micro * m.seq_len, 2 if row.dtype == "bfloat16" else 4
    return {"cfg": cfg, "row": row, "micro": micro, "acc": acc, "p": plan.count_params(cfg),
            "n": n, "w": w, "d": m.dims, "f": m.hidden(), "ht": m.heads * m.seq_len,
            "v": m.vocab_size, "L": m.layers}


def features(s: dict) -> dict[str, float]:
    wn, L = s["w"] * s["n"], s["L"]
    return {"g": s["p"], "a_d": L * wn * s["d"], "a_f": L * wn * s["f"],
            "a_s": L * wn * s["ht"], "x_d": wn * s["d"], "x_f": wn * s["f"],
            "x_s": wn * s["ht"], "logits": s["n"] * s["v"]}


def nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0 (active set: drop the negative, refit)."""
    keep = list(range(a.shape[1]))
    while True:
        x = np.zeros(a.shape[1])
        x[keep] = np.linalg.lstsq(a[:, keep], b, rcond=None)[0]
        if (x >= 0).all():
            return x
        keep = [i for i in keep if x[i] > 0]


def fit(dtype: str, runs: list[dict]) -> plan.Terms:
    """The terms for one dtype. A step peaks in its backward pass or in its update
    (plan.py); which one, for each run, is found by alternating: fit the backward pass's
    weights on the runs it peaks in and ``u`` on the others, assign each run to the moment
    the fit says is larger, again until the assignment holds."""
    base = plan.CPU_TERMS
    names = [n for n in MAIN if not (dtype == "bfloat16" and n in ("a_s", "x_s"))]
    main = [(r, s) for r, s in runs if s["acc"] == 1 and not s["row"].grad_checkpoint]
    # Start: the update where the state's parameters outweigh a step's activations.
    at_update = {id(r) for r, s in main if (r["peak"] - plan.STATE * s["p"]) / s["p"] < 40}
    terms = base
    for _ in range(10):
        backward = [(r, s) for r, s in main if id(r) not in at_update] or main
        a = np.array([[features(s)[n] / r["peak"] for n in names] for r, s in backward])
        b = np.array([(r["peak"] - plan.STATE * s["p"]) / r["peak"] for r, s in backward])
        # Pulled towards the CPU's weights (relative): the grid is small, and a term the
        # runs barely tell apart from another keeps the CPU's share, not all or nothing.
        cpu = np.array([max(getattr(base, n), 0.5) for n in names])
        a = np.vstack([a, np.diag(REGULARISE / cpu)])
        b = np.concatenate([b, np.full(len(names), REGULARISE)])
        x = dict(zip(names, nnls(a, b), strict=True))
        terms = plan.Terms(**{**base.__dict__, "bf16": 0.0, "logits_bf16": 0.0, "u_bf16": 0.0,
                              "a_s": 0.0, "x_s": 0.0,
                              **{k: round(float(v), 2) for k, v in x.items()}})
        update = [(r, s) for r, s in main if id(r) in at_update]
        if update:  # u: the mean bytes per parameter above the state and what is left over
            left = [plan_peak(s, plan.Terms(**{**terms.__dict__, "u": 0.0})).update
                    for r, s in update]
            u = float(np.mean([(r["peak"] - lo) / s["p"] for (r, s), lo in zip(update, left,
                                                                               strict=True)]))
            terms = plan.Terms(**{**terms.__dict__, "u": round(u, 2)})
        moved = {id(r) for r, s in main
                 if plan_peak(s, terms).update > plan_peak(s, terms).compute}
        if moved == at_update:
            break
        at_update = moved

    # Least squares centres the runs on 1; the plan's band is 0.90 to 1.15: lift the
    # backward pass's weights where that keeps every run of the fit inside it.
    ratios = [plan_peak(s, terms).compute / r["peak"] for r, s in main]
    lift = min(1.15 / max(ratios), max(1.0, 0.92 / min(ratios)))
    if lift > 1.0:
        terms = plan.Terms(**{**terms.__dict__, **{n: round(getattr(terms, n) * lift, 2)
                                                   for n in names}})

    def above_state(r: dict, s: dict, t: plan.Terms) -> float:
        return plan_peak(s, t).compute - r["peak"]

    # One weight each, the others fixed: the largest any of its runs needs (a plan may be
    # above a peak, less so below it).
    acc = [-above_state(r, s, terms) / s["p"] for r, s in runs if s["acc"] > 1]
    if acc:
        terms = plan.Terms(**{**terms.__dict__,
                              "accumulate": round(max(0.0, terms.accumulate + max(acc)), 2)})
    ckpt = [-above_state(r, s, terms) / (s["L"] * s["w"] * s["n"] * s["d"])
            for r, s in runs if s["row"].grad_checkpoint]
    if ckpt:
        terms = plan.Terms(**{**terms.__dict__,
                              "checkpoint": round(max(0.0, terms.checkpoint + max(ckpt)), 2)})
    return terms


def plan_peak(s: dict, t: plan.Terms) -> plan.Peak:
    saved = dict(plan.TERMS)
    plan.TERMS[("fit", s["row"].dtype)] = t
    try:
        return plan.estimate(s["cfg"], s["micro"], s["acc"], 1, backend="fit")
    finally:
        plan.TERMS.clear()
        plan.TERMS.update(saved)


def main() -> int:
    runs = [(r, shape(r)) for r in records()]
    for dtype in ("float32", "bfloat16"):
        mine = [(r, s) for r, s in runs if s["row"].dtype == dtype]
        t = fit(dtype, mine)
        changed = {k: v for k, v in t.__dict__.items() if v != plan.CPU_TERMS.__dict__[k]}
        terms = ", ".join(f"{k}={v}" for k, v in changed.items())
        print(f"{dtype}: {len(mine)} runs; Terms({terms})")
        for r, s in mine:
            peak = r["peak"]
            cpu = plan.estimate(s["cfg"], s["micro"], s["acc"], 1, backend="cpu").total
            now = "-"
            if ("cuda", dtype) in plan.TERMS:
                cuda = plan.estimate(s["cfg"], s["micro"], s["acc"], 1, backend="cuda")
                now = f"{cuda.total / peak:.2f}"
            print(f"  {s['row'].label():22s} micro {s['micro']:2d} x {s['acc']} "
                  f"ckpt {int(s['row'].grad_checkpoint)} vocab {s['v']:5d} "
                  f"peak {peak / 1e9:6.2f} GB  fit {plan_peak(s, t).total / peak:.2f}  "
                  f"plan.py cuda {now}  cpu {cpu / peak:.2f}  "
                  f"[{r.get('device', 'NVIDIA H200')}, {r['source']}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
