"""The bfloat16 step's working copy and the CUDA ordering (issue 33), and the memory plan's
per-backend terms against the peaks recorded on a GPU.

The working copy changes where the weights are cast, not what is computed: every test of
it compares with the step that casts the float32 masters inside the differentiated graph
(``working_copy=False``, the trainer's step before issue 33), bit for bit.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten

from mlxops.trainer import plan, step
from mlxops.trainer.config import load_config
from mlxops.trainer.model import Transformer
from mlxops.trainer.train import make_optimizer

ROOT = Path(__file__).resolve().parents[2]
CFG = load_config({"model": {"dims": 32, "layers": 2, "heads": 2, "seq_len": 16},
                   "train": {"dtype": "bfloat16", "steps": 10, "lr": 3e-3}})


def make(**options: object) -> step.Steps:
    mx.random.seed(0)
    model = Transformer(CFG.model)
    optimizer = make_optimizer(CFG)
    optimizer.init(model.trainable_parameters())
    mx.eval(model.parameters(), optimizer.state)
    return step.Steps(model, optimizer, mx.distributed.init(), mx.bfloat16, 0.0, **options)


def batch(i: int, rows: int = 4) -> tuple[mx.array, mx.array]:
    tokens = mx.random.randint(0, 256, (rows, 17), key=mx.random.key(100 + i))
    return tokens[:, :-1], tokens[:, 1:]


def train(steps: step.Steps, accumulate: bool = False) -> list[float]:
    losses = []
    for i in range(3):
        if accumulate:  # two micro-batches of 2, as the trainer runs them
            x, y = batch(i)
            loss_sum, acc = steps.first(x[:2], y[:2])
            loss_sum, acc = steps.next(x[2:], y[2:], loss_sum, acc)
            stats = steps.apply(loss_sum, acc, mx.array(2.0))
        else:
            stats, _ = steps.fused(*batch(i))
        mx.eval(stats, steps.state)
        losses.append(stats.tolist()[0])
    return losses


def weights(steps: step.Steps) -> dict[str, mx.array]:
    return dict(tree_flatten(steps.model.parameters()))


@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("grads_first", [False, True])
def test_the_working_copy_trains_bit_for_bit_as_a_cast_every_step(accumulate, grads_first):
    cast = make(working_copy=False, grads_first=False)
    copy = make(working_copy=True, grads_first=grads_first)
    assert cast.copy is None and copy.copy is not None
    assert train(cast, accumulate) == train(copy, accumulate)
    want, got = weights(cast), weights(copy)
    for k in want:
        assert got[k].dtype == mx.float32, k   # the masters stay float32
        assert mx.array_equal(got[k], want[k]), k
    for k, v in tree_flatten(copy.optimizer.state):
        if isinstance(v, mx.array) and v.ndim:
            assert v.dtype == mx.float32, k   # and so do AdamW's moments
    for k, v in copy.copy.items():  # the copy is the masters as the update left them
        assert v.dtype == mx.bfloat16 and mx.array_equal(v, got[k].astype(mx.bfloat16)), k


def test_float32_compute_keeps_no_copy():
    mx.random.seed(0)
    model = Transformer(CFG.model)
    optimizer = make_optimizer(CFG)
    optimizer.init(model.trainable_parameters())
    steps = step.Steps(model, optimizer, mx.distributed.init(), mx.float32, 0.0)
    assert steps.copy is None and len(steps.state) == 2


def test_refresh_casts_the_copy_again_after_the_masters_changed():
    """As a consistency repair changes the weights outside a step (trainer/train.py)."""
    steps = make()
    train(steps)
    key = "blocks.0.mlp.up.weight"
    steps.model.update({"blocks": [{"mlp": {"up": {"weight": mx.ones((86, 32))}}}, {}]})
    assert not mx.array_equal(steps.copy[key], mx.ones((86, 32), mx.bfloat16))  # stale
    steps.refresh()
    assert mx.array_equal(steps.copy[key], mx.ones((86, 32), mx.bfloat16))


def test_restore_undoes_the_copy_with_the_weights():
    """The out-of-memory back-off undoes a step: the copy must go back with the masters."""
    steps = make()
    train(steps)
    before = steps.snapshot()
    copy_before = dict(steps.copy)
    stats, _ = steps.fused(*batch(7))
    mx.eval(stats, steps.state)
    assert any(not mx.array_equal(steps.copy[k], v) for k, v in copy_before.items())
    steps.restore(before)
    assert all(mx.array_equal(steps.copy[k], v) for k, v in copy_before.items())


def test_the_gradients_go_first_on_cuda_only(monkeypatch):
    assert step.compute_backend() == "cpu"
    assert make().grads_first is False
    monkeypatch.setattr(step, "compute_backend", lambda: "cuda")
    assert make().grads_first is True
    assert make(grads_first=False).grads_first is False


# -- the plan's per-backend terms ---------------------------------------------------------

def row_config(dims: int, layers: int, heads: int, seq_len: int, batch: int, dtype: str,
               vocab_size: int = 256, **train: object):
    return load_config({
        "model": {"dims": dims, "layers": layers, "heads": heads, "seq_len": seq_len,
                  "vocab_size": vocab_size},
        "train": {"global_batch": batch, "micro_batch": batch, "dtype": dtype, **train}})


def test_a_plan_is_for_a_mac_unless_told_and_the_cpu_terms_did_not_move():
    cfg = row_config(256, 4, 4, 128, 8, "bfloat16")
    assert plan.estimate(cfg, 8) == plan.estimate(cfg, 8, backend="metal")
    assert plan.estimate(cfg, 8) == plan.estimate(cfg, 8, backend="cpu")
    assert plan.terms("cpu", "float32") == plan.Terms(
        g=1.8, bf16=4.0, accumulate=2.0, u=16.0, u_bf16=1.2, r=7.3, r_bf16=9.1, a_d=12.8,
        a_f=6.2, a_s=1.1, checkpoint=2.4, recomputed=0.47, x_d=25.6, x_f=3.1, x_s=1.7,
        logits=14.3, logits_bf16=3.0, embed_left=3.0, logits_left=11.1)


def test_an_unknown_backend_is_refused_by_name():
    with pytest.raises(ValueError, match="'rocm'.*metal, cpu, cuda"):
        plan.estimate(row_config(64, 1, 2, 32, 2, "float32"), 2, backend="rocm")


def test_cuda_bfloat16_attention_keeps_no_probabilities():
    """cuDNN's fused attention: at equal tokens the sequence's length changes nothing on
    CUDA in bfloat16; in float32 (MLX's unfused attention) and on a CPU it does."""
    short, long = (row_config(1024, 8, 16, 512, 16, "bfloat16"),
                   row_config(1024, 8, 16, 2048, 4, "bfloat16"))
    assert plan.estimate(short, 16, backend="cuda") == plan.estimate(long, 4, backend="cuda")
    assert plan.estimate(long, 4, backend="cpu").total > plan.estimate(short, 16,
                                                                         backend="cpu").total
    short32, long32 = (row_config(1024, 8, 16, 512, 16, "float32"),
                       row_config(1024, 8, 16, 2048, 4, "float32"))
    assert plan.estimate(long32, 4, backend="cuda").total > plan.estimate(
        short32, 16, backend="cuda").total


def h200_runs(*names: str) -> list[dict]:
    """The bundled trainer's runs recorded on an NVIDIA H200 (benchmarks/gpu_data/, MLX
    0.32.4's CUDA build) with the step as it runs there now: gradients first and, in
    bfloat16, the working copy (the files' first runs, from before, are left out)."""
    out = []
    for name in names:
        text = (ROOT / "benchmarks" / "gpu_data" / name).read_text()
        for r in (json.loads(x) for x in text.splitlines()) if name.endswith(".jsonl") \
                else json.loads(text):
            options = r["row"].get("options", {})
            now = r.get("grads_first", options.get("grads_first")) and (
                r["row"]["dtype"] == "float32"
                or r.get("working_copy", options.get("working_copy")))
            if r["kind"] == "trainer" and "peak" in r and now and not (
                    set(options) - {"working_copy", "grads_first"}):
                out.append(r)
    return out


#: Issue 33's table (its four rows, 50 steps, median after 12): the two runs the CUDA terms
#: were fitted to and the run made with them after the fit (h200-refit-table.json).
TABLES = ("h200-grads-first-table.json", "h200-final-table.json", "h200-refit-table.json")
#: The other runs the terms were fitted to: gpu_memory.py's grid, --check and --fresh.
FITTED = ("h200-grads-first-memory.jsonl", "h200-check-memory.jsonl", "h200-fresh-memory.jsonl")
#: The fitted runs the plan overestimates by more than 20% (benchmarks/README.md names
#: them): (dtype, dims, layers, heads, seq_len, batch, grad_checkpoint) -> plan / peak.
OVER = {("float32", 512, 4, 8, 512, 16, False): 1.25,
        ("float32", 1024, 8, 16, 512, 16, True): 1.32,
        ("bfloat16", 1024, 24, 16, 512, 8, False): 1.20}


def cuda_ratio(r: dict) -> float:
    row = r["row"]
    cfg = row_config(row["dims"], row["layers"], row["heads"], row["seq_len"], row["batch"],
                     row["dtype"], row["vocab_size"], grad_checkpoint=row["grad_checkpoint"])
    return plan.estimate(cfg, r["micro"], r["accumulation"], backend="cuda").total / r["peak"]


def test_the_cuda_plan_holds_issue_33s_table_in_the_band_measured_on_an_h200():
    """Issue 33's four rows, 50-step runs on an H200 (two sessions the CUDA terms were
    fitted to, one after): the plan within 0.90-1.15 of every measured peak."""
    runs = h200_runs(*TABLES)
    assert len(runs) == 4 + 8 + 8
    for r in runs:
        assert 0.90 <= cuda_ratio(r) <= 1.15, (r["row"], r["peak"], cuda_ratio(r))


def test_the_cuda_plan_is_never_more_than_10_percent_below_a_fitted_peak():
    """Every other run the CUDA terms were fitted to (benchmarks/gpu_fit.py: the grid,
    --check and --fresh, 6 steps each): the plan at least 0.90 of the measured peak (a plan
    below says a job fits that does not) and at most 1.20, but for the three runs
    :data:`OVER` names, held at their own figure: holding the table in the band costs
    them. The CPU's terms were 0.32 to 1.31 of them."""
    runs = h200_runs(*FITTED)
    ratios = []
    for r in runs:
        row = r["row"]
        key = (row["dtype"], row["dims"], row["layers"], row["heads"], row["seq_len"],
               row["batch"], row["grad_checkpoint"])
        ratio = cuda_ratio(r)
        assert 0.90 <= ratio <= OVER.get(key, 1.20) + 0.005, (key, r["micro"], ratio)
        ratios.append(ratio)
    assert len(runs) == 48 + 8 and min(ratios) < 0.905  # the floor is what binds
    assert sum(r > 1.205 for r in ratios) == 2  # the float32 two of OVER
