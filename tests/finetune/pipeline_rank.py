"""One rank of the fine-tuning pipeline tests (tests/finetune/test_pipeline_finetune.py):
an mlx-lm model fine-tuned by the pipeline step over local ring ranks (``pipe``: each
stage loads its own blocks from disk), or by one process (``one``: ``mlx_lm.load``, mlx-lm's
``linear_to_lora_layers`` and ``default_loss``, plain ``value_and_grad`` and
accumulation), on the same micro-batches from the same adapters.

    python pipeline_rank.py OUT MODE '{"model": DIR, "split": [2, 2, 2], ...}'

Writes ``OUT/losses-<rank>.json`` (float.hex, the last stage), ``OUT/trainable-<rank>.npz``
(by name), ``OUT/read-<rank>.json`` (bytes read from the model's files) and, with
``adapters``, each stage's adapters file there.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_map

from mlxops.finetune import pipeline as fp
from mlxops.finetune.config import load_config
from mlxops.trainer import pipeline, stagecheckpoint


def config(o: dict):
    return load_config({"model": {"path": o["model"]}, "data": {"path": "unused"},
                        "method": {"type": o.get("method", "lora"),
                                   "num_layers": o.get("num_layers", -1), "rank": 4}})


def batches(step: int, o: dict, vocab: int) -> list[tuple]:
    out = []
    for m in range(o["micro"]):
        rng = np.random.default_rng([5, step, m])
        tokens = mx.array(rng.integers(0, vocab, (o["size"], 17)), dtype=mx.int32)
        lengths = mx.array([[1 + 2 * (r % 2), 16 - 3 * (r % 3)] for r in range(o["size"])],
                           dtype=mx.int32)
        out.append((tokens, lengths))
    return out


def one(out: Path, o: dict) -> None:
    from mlx_lm import load
    from mlx_lm.tuner.trainer import default_loss

    cfg = config(o)
    model, _ = load(o["model"])
    layers = len(model.layers)
    fp.apply_stage_method(model, cfg, layers, 0, layers)
    fp.init_adapters(model, o["seed"])
    opt = optim.Adam(learning_rate=o["lr"])
    vg = nn.value_and_grad(model, lambda m, t, n: default_loss(m, t, n)[0])
    vocab = model.args.vocab_size
    losses = []
    for step in range(o["steps"]):
        loss_sum = acc = None
        for tokens, lengths in batches(step, o, vocab):
            loss, g = vg(model, tokens, lengths)
            loss_sum = loss if loss_sum is None else loss_sum + loss
            acc = g if acc is None else tree_map(mx.add, acc, g)
            mx.eval(loss_sum, acc)
        count = mx.array(float(o["micro"]))
        opt.update(model, tree_map(lambda a, c=count: a / c, acc))
        mx.eval(model.parameters(), opt.state)
        losses.append((loss_sum / count).item().hex())
    (out / "losses-0.json").write_text(json.dumps(losses))
    np.savez(out / "trainable-0.npz", **{k: np.array(v) for k, v in
                                          tree_flatten(model.trainable_parameters())})


def pipe(out: Path, o: dict) -> None:
    group = mx.distributed.init(strict=True)
    rank, size = group.rank(), group.size()
    counts = o["split"]
    start = sum(counts[:rank])
    stop = start + counts[rank]
    first, last = rank == 0, rank == size - 1
    cfg = config(o)
    mx.reset_peak_memory()
    model, mconfig, read = fp.load_stage(o["model"], start, stop, first, last)
    (out / f"read-{rank}.json").write_text(json.dumps(
        {"read": read, "peak": mx.get_peak_memory()}))
    fp.apply_stage_method(model, cfg, sum(counts), start, stop)
    fp.init_adapters(model, o["seed"], start)
    opt = optim.Adam(learning_rate=o["lr"])

    def name(k: str) -> str:
        return fp.to_global(k, start)

    begin = 0
    if o.get("resume"):
        begin = stagecheckpoint.load(Path(o["resume"]), model, opt, name=name,
                                     trainable_only=True)
    stage = fp.FinetuneStage(model, mconfig, start, first, last)
    step_fn = pipeline.PipelineStep(
        stage, group, rank, size,
        first_backward=fp.first_trained_stage(counts, o.get("num_layers", -1)))
    losses = []
    for step in range(begin, o["steps"]):
        loss, grads = step_fn.gradients(batches(step, o, int(mconfig["vocab_size"])))
        local = {fp.to_local(k, start): v for k, v in grads.items()}
        pipeline.update(model, opt, local)
        mx.eval(model.parameters(), opt.state)
        if loss is not None:
            losses.append(loss.item().hex())
        if o.get("save_at") == step + 1:
            stagecheckpoint.save(Path(o["save"]), rank, model, opt, step + 1, name=name,
                                 trainable_only=True)
            break
    if last:
        (out / f"losses-{rank}.json").write_text(json.dumps(losses))
    np.savez(out / f"trainable-{rank}.npz", **stage.trainable())
    if o.get("adapters"):
        fp.save_adapters(Path(o["adapters"]), rank, model, start)


if __name__ == "__main__":
    out, mode, opts = Path(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
    (one if mode == "one" else pipe)(out, opts)
