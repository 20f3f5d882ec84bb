"""ZeRO-1 (mlxops/trainer/zero.py): bitwise equal to the unsharded step over whole runs
of real ring ranks on this machine, with a stop + resume on as many ranks and on another
number of ranks (the slices re-sliced), and its layout's arithmetic."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten
from trainer_procs import PY, ROOT, run_script

from mlxops.trainer import zero, zero_checkpoint
from mlxops.trainer.config import load_config
from mlxops.trainer.model import Transformer
from mlxops.trainer.step import Steps
from mlxops.trainer.train import make_optimizer

SCRIPT = str(ROOT / "tests" / "trainer" / "zero_rank.py")
STEPS, STOP = 8, 4


def _run(out: Path, ranks: int, dtype: str, micro: int, stop: int, start: Path | None = None,
         env: dict | None = None) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    args = [PY, SCRIPT, str(out), dtype, str(micro), str(STEPS), str(stop)]
    proc = run_script(args + ([str(start)] if start else []), ranks=ranks, env=env,
                      timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [dict(np.load(out / f"rank-{r}.npz")) for r in range(ranks)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """float32 (one micro-batch a step) from 2 ranks, resumed on 2 and on 3; bfloat16
    (accumulating 2 micro-batches) from 3 ranks, resumed on 3 and on 2."""
    tmp = tmp_path_factory.mktemp("zero")
    got = {}
    got["f32-2"] = _run(tmp / "f32-2", 2, "float32", 12, STOP)
    got["f32-2-2"] = _run(tmp / "f32-2-2", 2, "float32", 12, STEPS, tmp / "f32-2")
    got["f32-2-3"] = _run(tmp / "f32-2-3", 3, "float32", 12, STEPS, tmp / "f32-2")
    got["bf16-3"] = _run(tmp / "bf16-3", 3, "bfloat16", 2, STOP)
    got["bf16-3-3"] = _run(tmp / "bf16-3-3", 3, "bfloat16", 2, STEPS, tmp / "bf16-3")
    got["bf16-3-2"] = _run(tmp / "bf16-3-2", 2, "bfloat16", 2, STEPS, tmp / "bf16-3")
    return got


def _steps(first: str, then: str) -> list[tuple[str, int]]:
    return [(first, s) for s in range(1, STOP + 1)] + [(then, s) for s in range(STOP + 1,
                                                                                 STEPS + 1)]


@pytest.mark.parametrize("first,then", [("f32-2", "f32-2-2"), ("bf16-3", "bf16-3-3")])
def test_a_whole_run_with_a_stop_and_resume_is_bitwise_the_unsharded_one(runs, first, then):
    for name, s in _steps(first, then):
        for rank, got in enumerate(runs[name]):
            assert np.array_equal(got[f"zero/w{s}"], got[f"plain/w{s}"]), (name, s, rank)
            assert got[f"zero/loss{s}"] == got[f"plain/loss{s}"], (name, s, rank)
    # the run trains: the weights move, the loss falls
    last = runs[then][0]
    assert not np.array_equal(last[f"zero/w{STEPS}"], runs[first][0]["zero/w1"])
    assert last[f"zero/loss{STEPS}"] < runs[first][0]["zero/loss1"]


@pytest.mark.parametrize("name,world", [("f32-2-3", 3), ("bf16-3-2", 2)])
def test_a_resume_on_another_number_of_ranks_reslices_the_moments_exactly(runs, name, world):
    assert len(runs[name]) == world
    for got in runs[name]:
        for moment in ("m", "v"):
            assert np.array_equal(got[f"loaded/{moment}"], got[f"loaded-plain/{moment}"])
        assert int(got["loaded/step"]) == STOP
        # and it continues as the unsharded run on that many ranks, bit for bit
        for s in range(STOP + 1, STEPS + 1):
            assert np.array_equal(got[f"zero/w{s}"], got[f"plain/w{s}"]), (name, s)


@pytest.mark.parametrize("elastic,same", [("f32-2-3", "f32-2-2"), ("bf16-3-2", "bf16-3-3")])
def test_after_a_resume_on_another_number_of_ranks_it_stays_within_float_tolerance(
        runs, elastic, same):
    # Another number of ranks sums the gradients in another order: not bitwise, close.
    for s in range(STOP + 1, STEPS + 1):
        a, b = runs[elastic][0][f"zero/w{s}"], runs[same][0][f"zero/w{s}"]
        np.testing.assert_allclose(a, b, rtol=0, atol=2e-3 if "bf16" in elastic else 1e-4)


def test_slices_are_uneven_and_bfloat16_runs_hold_bfloat16_weights(runs):
    bounds = [tuple(r["layout"]) for r in runs["bf16-3"]]
    total = bounds[0][0]
    assert total % 3 != 0
    assert [b[1:] for b in bounds] == [(0, 11083), (11083, 22166), (22166, total)]
    assert all(str(r["model_dtype"]) == "mlx.core.bfloat16" for r in runs["bf16-3"])
    assert all(str(r["model_dtype"]) == "mlx.core.float32" for r in runs["f32-2"])


def test_an_out_of_memory_back_off_undoes_the_sharded_step_on_every_rank(tmp_path):
    # Rank 1 abstains at step 3 (its peers are in the all_sum and the all_gather); every
    # rank restores its state and redoes the step: still bitwise the unsharded run.
    got = _run(tmp_path, 3, "float32", 12, STOP, env={"ZERO_ABSTAIN_AT": "3"})
    for r in got:
        assert float(r["abstained/flag3"]) < 1.0
        for s in range(1, STOP + 1):
            assert np.array_equal(r[f"zero/w{s}"], r[f"plain/w{s}"]), s


def test_a_slice_no_rank_holds_is_refused(tmp_path):
    lay = _layout([7], 2, 0)
    zero_checkpoint.save_slice(tmp_path, lay, {"flat.m": mx.ones((4,)), "step": mx.array(4)})
    one = _layout([7], 1, 0)
    with pytest.raises(zero_checkpoint.ZeroError,
                       match="no rank holds the optimizer slice of old rank 1 .of 2.: its "
                             "host is not in this run"):
        zero_checkpoint.load_slices(tmp_path, one, 2, mx.distributed.init(),
                         {"flat.m": mx.zeros((7,)), "step": mx.array(0)})


def _layout(sizes: list[int], world: int, rank: int) -> zero.Layout:
    tree = {f"a{i}": mx.zeros((n,)) for i, n in enumerate(sizes)}
    return zero.Layout.of(tree, world, rank)


def test_layout_cuts_the_flat_vector_in_ceil_sized_slices_the_last_shorter_or_empty():
    assert [_layout([5], 3, r).bounds() for r in range(3)] == [(0, 2), (2, 4), (4, 5)]
    assert [_layout([2], 3, r).bounds() for r in range(3)] == [(0, 1), (1, 2), (2, 2)]
    assert _layout([2], 3, 0).chunk == 1


def test_take_and_rebuild_round_trip_across_array_boundaries():
    tree = {"a": mx.arange(6).reshape(2, 3).astype(mx.float32), "b": mx.arange(6, 10)
            .astype(mx.float32), "c": mx.arange(10, 11).astype(mx.float32)}
    pieces = []
    for r in range(4):
        lay = zero.Layout.of(tree, 4, r)
        piece = lay.take(tree)
        assert piece.tolist() == list(range(11))[slice(*lay.bounds())]
        pieces.append(lay.padded(piece))
    assert all(p.size == 3 for p in pieces)
    full = mx.concatenate(pieces)[:11]
    back = zero.Layout.of(tree, 4, 0).rebuild(full)
    assert all(mx.array_equal(back[k], tree[k]).item() for k in tree)


def test_a_slice_file_names_its_offsets(tmp_path):
    lay = _layout([7], 2, 1)
    zero_checkpoint.save_slice(tmp_path, lay, {"flat.m": mx.ones((3,)), "step": mx.array(4)})
    (found,) = zero_checkpoint.saved_slices(tmp_path).values()
    assert (found.rank, found.world, found.lo, found.hi, found.total) == (1, 2, 4, 7, 7)
    assert zero_checkpoint.world_of(tmp_path) == 2


def test_an_uninitialised_optimizer_is_required():
    import mlx.nn as nn
    import mlx.optimizers as optim
    model = nn.Linear(2, 2)
    opt = optim.AdamW(1e-3)
    opt.init(model.trainable_parameters())
    with pytest.raises(ValueError, match="initialised on its slice"):
        zero.ZeroSteps(model, opt, mx.distributed.init(), mx.float32, 0.0)


def _bf16_pair() -> tuple[Steps, zero.ZeroSteps]:
    """The unsharded bfloat16 step (its working copy) and ZeRO-1's, on one rank, from the
    same weights."""
    cfg = load_config({"model": {"dims": 32, "layers": 2, "heads": 2, "seq_len": 16},
                       "train": {"dtype": "bfloat16", "steps": 10, "lr": 3e-3,
                                 "warmup": 1}})
    pair = []
    for sharded in (False, True):
        mx.random.seed(0)
        model, opt = Transformer(cfg.model), make_optimizer(cfg)
        if sharded:
            pair.append(zero.ZeroSteps(model, opt, mx.distributed.init(), mx.bfloat16, 1.0))
        else:
            opt.init(model.trainable_parameters())
            pair.append(Steps(model, opt, mx.distributed.init(), mx.bfloat16, 1.0))
        mx.eval(model.parameters(), opt.state)
    return pair[0], pair[1]


def _step(st: Steps, i: int) -> float:
    tokens = mx.random.randint(0, 256, (4, 17), key=mx.random.key(100 + i))
    x, y = tokens[:, :-1], tokens[:, 1:]
    if i % 2:  # accumulated micro-batches, as the trainer runs a split step
        loss_sum, acc = st.first(x[:2], y[:2])
        loss_sum, acc = st.next(x[2:], y[2:], loss_sum, acc)
        stats = st.apply(loss_sum, acc, mx.array(2.0))
    else:
        stats, _ = st.fused(x, y)
    mx.eval(stats, st.state)
    return stats.tolist()[0]


def _masters(st: Steps) -> dict[str, mx.array]:
    if isinstance(st, zero.ZeroSteps):
        return st.master_weights()
    return dict(tree_flatten(st.model.trainable_parameters()))


def test_a_bfloat16_sharded_step_runs_on_the_weights_it_gathered_not_a_stale_copy():
    # The model's bfloat16 weights, rebuilt by every step's all_gather, are the sharded
    # step's working copy: a Steps copy beside them was never recast by ZeRO's update, so
    # from the first step that moved the weights its forward ran on the old ones.
    plain, sharded = _bf16_pair()
    assert plain.copy is not None and sharded.copy is None
    for i in range(4):
        assert _step(plain, i) == _step(sharded, i), i
        a, b = _masters(plain), _masters(sharded)
        assert all(mx.array_equal(a[k], b[k]).item() for k in a), i


def test_a_bfloat16_sharded_snapshot_restores_the_step_it_undoes():
    # What an out-of-memory back-off does: snapshot, a step, restore, then the step again.
    plain, sharded = _bf16_pair()
    for st in (plain, sharded):
        _step(st, 0)
        before = st.snapshot()
        _step(st, 1)
        st.restore(before)
    for i in (1, 2):
        assert _step(plain, i) == _step(sharded, i), i
    a, b = _masters(plain), _masters(sharded)
    assert all(mx.array_equal(a[k], b[k]).item() for k in a)
