"""One rank of the ZeRO-1 test (tests/trainer/test_zero.py), run as 2 or 3 local ring ranks.

``zero_rank.py OUT DTYPE MICRO STEPS STOP [FROM]`` trains the same tiny model twice on
the same batches, with the unsharded step (:class:`mlxops.trainer.step.Steps`) and with
ZeRO-1 (:class:`mlxops.trainer.zero.ZeroSteps`), from step 1 (or from the checkpoint in
``FROM``, written by an earlier run of this script, maybe with another number of ranks)
up to ``STOP`` of a ``STEPS``-step schedule; there both write a checkpoint into ``OUT``.
Each rank saves every step's float32 weights and loss of both runs (and, resumed, the
optimizer moments each loaded, gathered in full) to ``OUT/rank-<r>.npz``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from mlxops.trainer import zero, zero_checkpoint
from mlxops.trainer.config import load_config
from mlxops.trainer.model import Transformer
from mlxops.trainer.resume import restore_optimizer
from mlxops.trainer.step import Steps
from mlxops.trainer.train import make_optimizer

#: 33,248 parameters: not divisible by 3 (uneven slices at 3 ranks).
CONFIG = {"model": {"dims": 32, "layers": 2, "heads": 2, "vocab_size": 250, "seq_len": 16},
          "data": {"source": "synthetic"},
          "train": {"steps": 8, "global_batch": 12, "lr": 3e-3, "warmup": 2,
                    "weight_decay": 0.1, "grad_clip": 1.0}}
PER_STEP = 12  # sequences a step over all ranks (every world here divides it)


def batch(step: int, rank: int, world: int, seq: int, vocab: int) -> list[tuple]:
    """This rank's share of step ``step``'s global batch: the same sequences whatever
    the number of ranks (the global batch is cut in rank order)."""
    rows = np.random.default_rng(step).integers(0, vocab, (PER_STEP, seq + 1))
    share = PER_STEP // world
    mine = rows[rank * share:(rank + 1) * share]
    return [(mx.array(mine[:, :-1]), mx.array(mine[:, 1:]))]


def flat32(params: dict) -> np.ndarray:
    return np.concatenate([np.array(a.astype(mx.float32)).reshape(-1)
                           for _, a in tree_flatten(params)])


def main(out: str, dtype: str, micro: int, steps: int, stop: int, start: str = "") -> None:
    group = mx.distributed.init(strict=True)
    rank, world = group.rank(), group.size()
    cfg = load_config({**CONFIG, "train": {**CONFIG["train"], "steps": steps,
                                           "dtype": dtype, "micro_batch": micro}})
    compute = mx.bfloat16 if dtype == "bfloat16" else mx.float32
    m = cfg.model
    saved: dict[str, np.ndarray] = {}
    first = 1
    mx.random.seed(7)
    model, opt = Transformer(m), make_optimizer(cfg)
    opt.init(model.trainable_parameters())
    if start:  # restored before the steps are compiled over its state, as the trainer does
        src = Path(start)
        ck = mx.load(str(src / "plain-model.safetensors"))
        model.load_weights(list(ck.items()), strict=True)
        opt_state = dict(mx.load(str(src / "plain-optimizer.safetensors")))
        restore_optimizer(opt, opt_state, model.trainable_parameters())
    mx.random.seed(7)
    runs = {"plain": Steps(model, opt, group, compute, cfg.train.grad_clip),
            "zero": zero.ZeroSteps(Transformer(m), make_optimizer(cfg), group, compute,
                                   cfg.train.grad_clip)}
    if start:
        plain, z = runs["plain"], runs["zero"]
        old_world = zero_checkpoint.world_of(src / "zero")
        slices = zero_checkpoint.load_slices(src / "zero", z.layout, old_world, group,
                                             z.slice_state())
        z.load(dict(mx.load(str(src / "zero-model.safetensors"))), slices)
        first = int(plain.optimizer.state["step"].item()) + 1
        for name in ("m", "v"):
            mine = slices[f"{zero.FLAT}.{name}"]
            saved[f"loaded/{name}"] = np.array(zero.gather(mine, z.layout, group))
            full = dict(tree_flatten(plain.optimizer.state))
            saved[f"loaded-plain/{name}"] = np.concatenate(
                [np.array(full[f"{k}.{name}"]).reshape(-1) for k, _ in tree_flatten(
                    plain.model.trainable_parameters())])
        saved["loaded/step"] = np.array(z.optimizer.state["step"])
    abstain_at = int(os.environ.get("ZERO_ABSTAIN_AT", "0"))
    for s in range(first, stop + 1):
        for kind, st in runs.items():
            if kind == "zero" and s == abstain_at:
                # An out-of-memory back-off, as the loop runs it: rank 1 joins the step's
                # collectives with nothing, every rank sees the flag and undoes the step.
                before = st.snapshot()
                if rank == 1:
                    flags = st.abstain()
                else:
                    flags, _ = st.fused(*batch(s, rank, world, m.seq_len, m.vocab_size)[0])
                mx.eval(flags, st.state)
                saved[f"abstained/flag{s}"] = np.array(flags[1])
                st.restore(before)
            batches = batch(s, rank, world, m.seq_len, m.vocab_size)
            x, y = batches[0]
            if micro >= x.shape[0]:
                stats, _ = st.fused(x, y)
            else:
                loss_sum, acc = None, None
                for i in range(0, x.shape[0], micro):
                    xb, yb = x[i:i + micro], y[i:i + micro]
                    if acc is None:
                        loss_sum, acc = st.first(xb, yb)
                    else:
                        loss_sum, acc = st.next(xb, yb, loss_sum, acc)
                    mx.eval(loss_sum, acc)
                stats = st.apply(loss_sum, acc, mx.array(float(x.shape[0] // micro)))
            mx.eval(stats, st.state)
            weights = (st.master_weights() if kind == "zero"
                       else dict(tree_flatten(st.model.trainable_parameters())))
            saved[f"{kind}/w{s}"] = np.concatenate(
                [np.array(a).reshape(-1) for a in weights.values()])
            saved[f"{kind}/loss{s}"] = np.array(stats[0])
    plain, z = runs["plain"], runs["zero"]
    if stop < steps:  # the checkpoint a later run resumes from
        (Path(out) / "zero").mkdir(parents=True, exist_ok=True)
        weights = z.master_weights()  # a collective: every rank
        zero_checkpoint.save_slice(Path(out) / "zero", z.layout, z.slice_state())
        if rank == 0:
            mx.save_safetensors(f"{out}/zero-model.safetensors", weights)
            mx.save_safetensors(f"{out}/plain-model.safetensors",
                                dict(tree_flatten(plain.model.parameters())))
            mx.save_safetensors(f"{out}/plain-optimizer.safetensors",
                                dict(tree_flatten(plain.optimizer.state)))
    saved["layout"] = np.array([z.layout.total, *z.layout.bounds()])
    saved["model_dtype"] = np.array(str(next(iter(tree_flatten(z.model.parameters())))[1]
                                        .dtype))
    np.savez(f"{out}/rank-{rank}.npz", **saved)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]),
         *sys.argv[6:])
