"""Fit the memory plan's CUDA terms (mlxops/trainer/plan.py) to the peaks measured on a GPU.

Reads the runs kept in ``benchmarks/gpu_data/`` (gpu_memory.py's grid, --check and --fresh,
and the trainer's runs of gpu_bf16.py with the trainer's defaults), then for each compute
dtype fits the weights of the plan's terms (``FITTED``; in bfloat16 ``a_s = x_s = 0``: MLX's
CUDA build runs bfloat16 attention through cuDNN's fused kernel, which keeps no H x T
probabilities) to every run at once. The plan is linear in the weights at either of a
step's two moments (:func:`basis`), so the fit is two linear programs (:func:`solve`):
every run's plan at least 0.90 of its peak, the largest excess over 1.15 minimised, then
the plans nearest the band's middle under that ceiling; which moment each run peaks in is
found by alternating (:func:`fit`). Weights are rounded up to 2 decimals. ``CHECKS`` (runs
made to check a fit: issue 33's final table, gpu_memory.py --third) is left out.

Prints the fitted terms and plan / peak for every run. Needs scipy (``pip install
scipy``); run on any machine (it measures nothing)::

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
CHECKS = ("h200-final-table.json", "h200-third-memory.jsonl")


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


#: The weights fitted for each dtype; the others keep the CPU's (``recomputed``, the
#: all-reduce's, the update's leftovers) or are folded into these (``bf16``, ``u_bf16``,
#: ``logits_bf16``: the terms are per dtype here). In bfloat16 ``a_s = x_s = 0``: cuDNN.
FITTED = ("g", "accumulate", "u", "u_layer", "a_d", "a_f", "a_s", "checkpoint",
          "g_checkpoint", "x_d", "x_f", "x_s", "x_hd", "logits")
#: The plan's band (0.90 to 1.15 of the peak) and its middle.
LOW, HIGH = 0.90, 1.15
CENTRE = (LOW + HIGH) / 2


def basis(s: dict, names: list[str]) -> tuple[np.ndarray, np.ndarray, float, float]:
    """The plan for run ``s`` is linear in the fitted weights at either moment: each weight's
    bytes at the pass's peak and at the update's (one per unit of weight), and what the
    fixed weights and the state give."""
    zero = {n: 0.0 for n in FITTED} | {"bf16": 0.0, "u_bf16": 0.0, "logits_bf16": 0.0}
    fixed = plan.Terms(**{**plan.CPU_TERMS.__dict__, **zero})
    base = plan_peak(s, fixed)
    comp, upd = [], []
    for n in names:
        one = plan_peak(s, plan.Terms(**{**fixed.__dict__, n: 1.0}))
        comp.append(one.compute - base.compute)
        upd.append(one.update - base.update)
    return np.array(comp, float), np.array(upd, float), base.compute, base.update


def solve(rows: list, at_update: list[bool], names: list[str]) -> tuple[np.ndarray, float]:
    """Two linear programs over the weights x >= 0. Every run's plan is the larger of its two
    moments, so it is at least ``LOW`` of its peak when the one said to be larger
    (``at_update``) is, and at most ``HIGH - t`` when both are. The floor is kept in every
    run (a plan below a peak says a job fits that does not); the first program maximises t
    (t < 0: some runs above ``HIGH``, by at most -t), the second keeps that ceiling (plus
    half a percent) and brings the runs' plans nearest the band's middle (the sum of
    |plan / peak - CENTRE|). Returns the weights and t."""
    from scipy.optimize import linprog  # benchmarks only: pip install scipy

    k, m = len(names), len(rows)
    upper, lower = [], []
    for (peak, comp, up, c0, u0), moved in zip(rows, at_update, strict=True):
        upper += [(comp / peak, HIGH - c0 / peak), (up / peak, HIGH - u0 / peak)]
        lower.append(((up if moved else comp) / peak, (u0 if moved else c0) / peak))
    # 1: maximise t. Variables [x, t].
    a = [np.append(v, 1.0) for v, _ in upper] + [np.append(-v, 0.0) for v, _ in lower]
    b = [h for _, h in upper] + [c - LOW for _, c in lower]
    r = linprog(np.append(np.zeros(k), -1.0), A_ub=a, b_ub=b,
                bounds=[(0, None)] * k + [(None, 1.0)], method="highs")
    margin = float(r.x[-1])
    # 2: under that ceiling, the least total distance to the middle. Variables [x, e].
    keep = margin - 0.005
    a2 = [np.concatenate([v, np.zeros(m)]) for v, _ in upper] + \
         [np.concatenate([-v, np.zeros(m)]) for v, _ in lower]
    b2 = [h - keep for _, h in upper] + [c - LOW for _, c in lower]
    for i, (v, c) in enumerate(lower):  # e_i >= |v x + c - CENTRE|
        e = np.zeros(m)
        e[i] = -1.0
        a2 += [np.concatenate([v, e]), np.concatenate([-v, e])]
        b2 += [CENTRE - c, c - CENTRE]
    r2 = linprog(np.concatenate([np.zeros(k), np.ones(m)]), A_ub=a2, b_ub=b2,
                 bounds=[(0, None)] * (k + m), method="highs")
    return (r2.x[:k] if r2.success else r.x[:k]), margin


def fit(dtype: str, runs: list[dict]) -> plan.Terms:
    """The terms for one dtype, fitted to every run at once (:func:`solve`). Which moment
    is larger in each run is found by alternating: start from plan.py's CUDA terms, solve,
    take the moments the solution says are larger, again until they hold."""
    names = [n for n in FITTED if not (dtype == "bfloat16" and n in ("a_s", "x_s"))]
    rows = [(r["peak"], *basis(s, names)) for r, s in runs]
    now = [plan.estimate(s["cfg"], s["micro"], s["acc"], 1, backend="cuda") for _, s in runs]
    at_update = [e.update > e.compute for e in now]
    best, best_margin = None, -np.inf
    for _ in range(8):
        x, margin = solve(rows, at_update, names)
        x = np.maximum(np.ceil(x * 100 - 1e-6) / 100, 0.0) + 0.0  # up: the floor holds
        if margin > best_margin:
            best, best_margin = x, margin
        moved = [u0 + up @ x > c0 + comp @ x for _, comp, up, c0, u0 in rows]
        if moved == at_update:
            break
        at_update = moved
    zero = {"bf16": 0.0, "u_bf16": 0.0, "logits_bf16": 0.0, "a_s": 0.0, "x_s": 0.0}
    return plan.Terms(**{**plan.CPU_TERMS.__dict__, **zero,
                         **{n: float(v) for n, v in zip(names, best, strict=True)}})


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
