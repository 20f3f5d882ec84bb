"""Fit the memory plan's CUDA terms (mlxops/trainer/plan.py) to the peaks measured on a GPU.

Reads the runs kept in ``benchmarks/gpu_data/`` (gpu_memory.py's grid, --check and --fresh,
and the trainer's runs of gpu_bf16.py with the trainer's defaults), then for each compute
dtype fits the weights of the plan's terms (``FITTED``; in bfloat16 ``a_s = x_s = 0``: MLX's
CUDA build runs bfloat16 attention through cuDNN's fused kernel, which keeps no H x T
probabilities) to every run at once. The plan is linear in the weights at either of a
step's two moments (:func:`basis`), so the fit is linear programs (:func:`solve`): issue
33's table (``TABLES``: its four rows, 50-step runs) held within 0.90-1.15 of its peaks,
every other run's plan at least 0.90 of its peak, the largest excess over 1.15 of those
minimised; then the table's margin inside the band; then the plans nearest the band's
middle. Which moment each run peaks in is found by alternating (:func:`fit`). Weights are
rounded up to 2 decimals. ``CHECKS`` (runs made to check a fit: gpu_memory.py --third,
gpu_growth.py, the table measured again after the fit) are printed, not fitted.

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
#: Issue 33's table (its four rows, 50 steps each, median after 12): held in the band.
TABLES = ("h200-grads-first-table.json", "h200-final-table.json")
#: Runs made to check a fit, not fitted: configs no fit had seen (gpu_memory.py --third,
#: 10 steps), gpu_growth.py's (12 steps, the peak step by step) and issue 33's table
#: measured again with the terms this fit gave (h200-refit-table.json).
CHECKS = ("h200-third-memory.jsonl", "h200-growth.jsonl", "h200-refit-table.json")


def records() -> list[dict]:
    """Every trainer run on CUDA in the data kept here that ran the trainer's step as it is
    there now: the gradients launched first, and in bfloat16 the working copy (runs record
    both; the first runs, from before, said so in their options or not at all)."""
    out = []
    for path in sorted(DATA.glob("*.json*")):
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
#: What a later program may give up of an earlier one's optimum (t, then m: :func:`solve`).
SLACK = 0.005
#: Room left under a table run's ceiling for the weights' rounding up (:func:`fit`).
ROUNDING = 0.002


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


def lp_rows(rows: list, at_update: list[bool]) -> tuple[list, list]:
    """Each run's plan / peak as ``v . x + c`` at both moments (the ceiling holds both) and
    at the moment said to be larger (``at_update``: the floor and the middle use that)."""
    both, chosen = [], []
    for (peak, comp, up, c0, u0), moved in zip(rows, at_update, strict=True):
        both.append([(comp / peak, c0 / peak), (up / peak, u0 / peak)])
        chosen.append(((up if moved else comp) / peak, (u0 if moved else c0) / peak))
    return both, chosen


def solve(rows: list, at_update: list[bool], table: list[bool]
          ) -> tuple[np.ndarray, float, float]:
    """Three linear programs over the weights x >= 0, the same constraints in each:

    - every run's plan at least ``LOW`` of its peak (a plan below a peak says a job fits
      that does not), a table run's at least ``LOW + m``;
    - a table run's plan at most ``HIGH - m`` (its band is hard: m >= 0), every other run's
      at most ``HIGH - t`` (t <= 0: runs above ``HIGH`` by at most -t);

    then (1) maximises t, the worst excess minimised; (2) keeps that (within
    :data:`SLACK`) and maximises m, the table runs' margin inside the band, which a table
    measured again needs (its peaks moved by 3% between sessions); (3) keeps both and brings
    the runs' plans nearest the band's middle (the sum of |plan / peak - CENTRE|). The plan
    is the larger of a run's two moments, so the ceiling holds both and the floor the one
    said to be larger (``at_update``). Returns the weights, t and m; None for the weights
    where (1) has no solution (the floor cannot hold in every run)."""
    from scipy.optimize import linprog  # benchmarks only: pip install scipy

    both, chosen = lp_rows(rows, at_update)
    k, n = len(rows[0][1]), len(rows)
    # Variables [x (k), t, m, e (n)]: e_i >= |plan_i / peak_i - CENTRE|.
    a, b = [], []

    def add(vx: np.ndarray, t: float, m: float, e: dict[int, float], rhs: float) -> None:
        extra = np.zeros(2 + n)
        extra[0], extra[1] = t, m
        for i, v in e.items():
            extra[2 + i] = v
        a.append(np.concatenate([vx, extra]))
        b.append(rhs)

    for i, (moments, (v, c), hard) in enumerate(zip(both, chosen, table, strict=True)):
        add(-v, 0.0, float(hard), {}, c - LOW)                     # floor (+ m)
        for vm, cm in moments:                                     # ceiling (- m or - t)
            add(vm, float(not hard), float(hard), {}, HIGH - ROUNDING * hard - cm)
        add(v, 0.0, 0.0, {i: -1.0}, CENTRE - c)                    # middle, both sides
        add(-v, 0.0, 0.0, {i: -1.0}, c - CENTRE)

    def run(objective: np.ndarray, t: tuple, m: tuple) -> np.ndarray | None:
        bounds = [(0, None)] * k + [t, m] + [(0, None)] * n
        r = linprog(objective, A_ub=np.array(a), b_ub=np.array(b), bounds=bounds,
                    method="highs")
        return r.x if r.success else None

    def unit(j: int) -> np.ndarray:
        o = np.zeros(k + 2 + n)
        o[j] = -1.0
        return o

    half = (HIGH - LOW) / 2
    z = run(unit(k), (None, 0.0), (0.0, 0.0))                      # (1) max t
    if z is None:
        return None, float("nan"), float("nan")
    t = float(z[k])
    z = run(unit(k + 1), (t - SLACK, 0.0), (0.0, half))            # (2) max m
    m = float(z[k + 1])
    middle = np.concatenate([np.zeros(k + 2), np.ones(n)])
    z3 = run(middle, (t - SLACK, 0.0), (max(0.0, m - SLACK), half))  # (3) the middle
    z = z3 if z3 is not None else z
    return z[:k], float(z[k]), float(z[k + 1])


def fit(dtype: str, runs: list[tuple[dict, dict]]) -> tuple[plan.Terms, float, float]:
    """The terms for one dtype, fitted to every run at once (:func:`solve`; the runs of
    :data:`TABLES` held in the band). Which moment is larger in each run is found by
    alternating: start from plan.py's CUDA terms, solve, take the moments the solution says
    are larger, again until they hold. Returns the terms, t and m (:func:`solve`)."""
    names = [n for n in FITTED if not (dtype == "bfloat16" and n in ("a_s", "x_s"))]
    rows = [(r["peak"], *basis(s, names)) for r, s in runs]
    table = [r["source"] in TABLES for r, _ in runs]
    now = [plan.estimate(s["cfg"], s["micro"], s["acc"], 1, backend="cuda") for _, s in runs]
    at_update = [e.update > e.compute for e in now]
    best, score = None, (-np.inf, -np.inf)
    for _ in range(8):
        x, t, m = solve(rows, at_update, table)
        if x is None:
            raise SystemExit(f"{dtype}: no weights hold the floor in every run and the "
                             f"table's runs in the band")
        x = np.maximum(np.ceil(x * 100 - 1e-6) / 100, 0.0) + 0.0  # up: the floor holds
        if (t, m) > score:
            best, score = x, (t, m)
        moved = [u0 + up @ x > c0 + comp @ x for _, comp, up, c0, u0 in rows]
        if moved == at_update:
            break
        at_update = moved
    zero = {"bf16": 0.0, "u_bf16": 0.0, "logits_bf16": 0.0, "a_s": 0.0, "x_s": 0.0}
    terms = plan.Terms(**{**plan.CPU_TERMS.__dict__, **zero,
                          **{n: float(v) for n, v in zip(names, best, strict=True)}})
    return terms, *score


def plan_peak(s: dict, t: plan.Terms) -> plan.Peak:
    saved = dict(plan.TERMS)
    plan.TERMS[("fit", s["row"].dtype)] = t
    try:
        return plan.estimate(s["cfg"], s["micro"], s["acc"], 1, backend="fit")
    finally:
        plan.TERMS.clear()
        plan.TERMS.update(saved)


def role(r: dict) -> str:
    return "table" if r["source"] in TABLES else "check" if r["source"] in CHECKS else "fit"


def outside(label: str, got: list[tuple[float, str]]) -> str:
    """One line: the range of plan / peak over ``got`` and the runs outside the band."""
    if not got:
        return f"    {label}: none"
    vals = [v for v, _ in got]
    low = [f"{name} {v:.2f}" for v, name in got if v < LOW]
    high = [f"{name} {v:.2f}" for v, name in got if v > HIGH]
    return (f"    {label}: {len(got)} runs, {min(vals):.3f} to {max(vals):.3f}; "
            f"below {LOW}: {', '.join(low) or 'none'}; above {HIGH}: {', '.join(high) or 'none'}")


def main() -> int:
    runs = [(r, shape(r)) for r in records()]
    for dtype in ("float32", "bfloat16"):
        mine = [(r, s) for r, s in runs if s["row"].dtype == dtype]
        fitted = [(r, s) for r, s in mine if role(r) != "check"]
        t, worst, margin = fit(dtype, fitted)
        changed = {k: v for k, v in t.__dict__.items() if v != plan.CPU_TERMS.__dict__[k]}
        terms = ", ".join(f"{k}={v}" for k, v in changed.items())
        print(f"{dtype}: {len(fitted)} runs fitted "
              f"({sum(role(r) == 'table' for r, _ in fitted)} of them the table's), "
              f"worst excess over {HIGH} {max(0.0, -worst):.3f}, the table's margin inside "
              f"the band {margin:.3f}; Terms({terms})")
        got: dict[str, list] = {"table": [], "fit": [], "check": []}
        for r, s in mine:
            peak = r["peak"]
            cpu = plan.estimate(s["cfg"], s["micro"], s["acc"], 1, backend="cpu").total
            now = "-"
            if ("cuda", dtype) in plan.TERMS:
                cuda = plan.estimate(s["cfg"], s["micro"], s["acc"], 1, backend="cuda")
                now = f"{cuda.total / peak:.2f}"
            ratio = plan_peak(s, t).total / peak
            ckpt = " ckpt" if s["row"].grad_checkpoint else ""
            acc = f" x{s['acc']}" if s["acc"] > 1 else ""
            name = f"{s['row'].label()}{ckpt}{acc}"
            got[role(r)].append((ratio, f"{name} ({r['source']})"))
            print(f"  {role(r):5s} {s['row'].label():22s} micro {s['micro']:2d} x {s['acc']} "
                  f"ckpt {int(s['row'].grad_checkpoint)} vocab {s['v']:5d} "
                  f"steps {len(r.get('seconds', [])):2d} "
                  f"peak {peak / 1e9:6.2f} GB  fit {ratio:.3f}  "
                  f"plan.py cuda {now}  cpu {cpu / peak:.2f}  "
                  f"[{r.get('device', 'NVIDIA H200')}, {r['source']}]")
        for key in ("table", "fit", "check"):
            print(outside(key, got[key]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
