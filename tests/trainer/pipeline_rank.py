"""One rank of the pipeline tests (tests/trainer/test_pipeline_trainer.py): the bundled
trainer's model trained by the pipeline step over local ring ranks (``pipe``), or by one
process with plain ``value_and_grad`` and accumulation (``one``), on the same micro-batches.

    python pipeline_rank.py OUT MODE '{"steps": 3, "micro": 4, ...}'

Writes ``OUT/losses-<rank>.json`` (the last stage's, as float.hex) and
``OUT/params-<rank>.npz`` (the weights it holds at the end, by name).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import mlx.core as mx
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_map

from mlxops.trainer import pipeline, stagecheckpoint
from mlxops.trainer.config import ModelConfig
from mlxops.trainer.model import loss_fn
from mlxops.trainer.stagemodel import StageModel, TrainerStage, whole_model


def batches(step: int, micro: int, size: int, cfg: ModelConfig) -> list[tuple]:
    out = []
    for m in range(micro):
        rng = np.random.default_rng([11, step, m])
        x = mx.array(rng.integers(0, cfg.vocab_size, (size, cfg.seq_len + 1)), dtype=mx.int32)
        out.append((x[:, :-1], x[:, 1:]))
    return out


def one(out: Path, cfg: ModelConfig, o: dict) -> None:
    model = whole_model(cfg, o["seed"])
    opt = optim.AdamW(learning_rate=o["lr"])
    dtype = getattr(mx, o.get("dtype", "float32"))

    def cast_loss(params: dict, x: mx.array, y: mx.array) -> mx.array:
        # As the trainer's step: the float32 master weights cast, the cast differentiated.
        model.update(tree_map(lambda p: p.astype(dtype), params))
        return loss_fn(model, x, y)

    grad = mx.value_and_grad(cast_loss)

    def vg(model, x, y):
        params = model.trainable_parameters()
        loss, g = grad(params, x, y)
        model.update(params)
        return loss, g

    losses = []
    for step in range(o["steps"]):
        loss_sum = acc = None
        for x, y in batches(step, o["micro"], o["size"], cfg):
            loss, g = vg(model, x, y)
            loss_sum = loss if loss_sum is None else loss_sum + loss
            acc = g if acc is None else tree_map(mx.add, acc, g)
            mx.eval(loss_sum, acc)
        count = mx.array(float(o["micro"]))
        grads = tree_map(lambda a, c=count: a / c, acc)
        if o.get("clip"):
            grads, _ = optim.clip_grad_norm(grads, o["clip"])
        opt.update(model, grads)
        mx.eval(model.parameters(), opt.state)
        losses.append((loss_sum / count).item().hex())
    (out / "losses-0.json").write_text(json.dumps(losses))
    np.savez(out / "params-0.npz", **{k: np.array(v) for k, v in
                                       tree_flatten(model.parameters())})


def pipe(out: Path, cfg: ModelConfig, o: dict) -> None:
    group = mx.distributed.init(strict=True)
    rank, size = group.rank(), group.size()
    counts = o["split"]
    assert len(counts) == size
    start = sum(counts[:rank])
    first, last = rank == 0, rank == size - 1
    model = StageModel(cfg, start, start + counts[rank], first, last, o["seed"])
    opt = optim.AdamW(learning_rate=o["lr"])
    begin = 0
    if o.get("resume"):
        begin = stagecheckpoint.load(Path(o["resume"]), model, opt)
    dtype = getattr(mx, o.get("dtype", "float32"))
    step_fn = pipeline.PipelineStep(TrainerStage(model, cfg.dims, dtype), group, rank, size,
                                    tied=pipeline.TIED if cfg.tie_embeddings else None)
    losses = []
    for step in range(begin, o["steps"]):
        loss, grads = step_fn.gradients(batches(step, o["micro"], o["size"], cfg))
        if o.get("clip"):
            grads = step_fn.clip(grads, o["clip"])
        pipeline.update(model, opt, grads)
        mx.eval(model.parameters(), opt.state)
        if loss is not None:
            losses.append(loss.item().hex())
        if o.get("save_at") == step + 1:
            stagecheckpoint.save(Path(o["save"]), rank, model, opt, step + 1)
            break
    if last:
        (out / f"losses-{rank}.json").write_text(json.dumps(losses))
    np.savez(out / f"params-{rank}.npz", **{k: np.array(v) for k, v in
                                            tree_flatten(model.parameters())})


if __name__ == "__main__":
    out, mode, opts = Path(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
    cfg = ModelConfig(dims=32, layers=6, heads=4, vocab_size=64, seq_len=16,
                      tie_embeddings=opts.get("tied", False))
    (one if mode == "one" else pipe)(out, cfg, opts)
