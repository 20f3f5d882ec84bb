"""The fine-tuning memory plan (mlxops/finetune/plan.py) against MLX's measured peak.

Each config builds a random model with mlx-lm's own classes (llama, or qwen2 quantized to
4 bits as ``mlx_lm.convert -q`` does), saves it in the mlx-lm layout, and in a fresh
process: loads it with ``mlx_lm.utils.load_model``, applies the method with
mlxops.finetune.model.apply_method (mlx-lm's ``linear_to_lora_layers``, or unfrozen
blocks), then runs 3 training steps as ``mlx_lm.lora``'s trainer does (``nn.value_and_grad``
of the cross-entropy over full-length random sequences, the optimizer's update, one
``mx.eval``) and reads ``mx.get_peak_memory()``. The plan reads only the saved files.

    python benchmarks/finetune_memory.py              # the grid below, about 2 min on 2 cores
    python benchmarks/finetune_memory.py --jsonl out.jsonl

What it measures is mlx-lm's step, one rank, no accumulation: the loop of
``python -m mlxops.finetune`` compiles its step and holds what the bundled trainer holds.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ARCHS = {
    "llama": {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 4,
              "intermediate_size": 704, "num_attention_heads": 8, "num_key_value_heads": 4,
              "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True,
              "vocab_size": 4096, "max_position_embeddings": 4096},
    "qwen2": {"model_type": "qwen2", "hidden_size": 256, "num_hidden_layers": 4,
              "intermediate_size": 704, "num_attention_heads": 8, "num_key_value_heads": 4,
              "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": True,
              "vocab_size": 4096, "max_position_embeddings": 4096},
}

MEASURE = r"""
import json, sys
import mlx.core as mx, mlx.nn as nn, mlx.optimizers as optim
from mlx_lm.utils import load_model
from mlxops.finetune.config import from_dict
from mlxops.finetune.model import apply_method
cfg = from_dict(json.loads(sys.argv[1]))
model, _ = load_model(__import__('pathlib').Path(cfg.model.path))
apply_method(model, cfg)
opt = optim.AdamW(learning_rate=1e-5)
def loss(model, x, y):
    logits = model(x)
    return nn.losses.cross_entropy(logits.astype(mx.float32), y).mean()
step = nn.value_and_grad(model, loss)
vocab = model.args.vocab_size
mx.random.seed(0)
micro, t = int(sys.argv[2]), cfg.train.max_seq_len
for _ in range(3):
    x = mx.random.randint(0, vocab, (micro, t + 1))
    value, grads = step(model, x[:, :-1], x[:, 1:])
    opt.update(model, grads)
    mx.eval(value, model.trainable_parameters(), opt.state)
print(json.dumps({"peak": mx.get_peak_memory()}))
"""


def build(out: Path, arch: str, quantize: bool) -> Path:
    import mlx.core as mx
    from mlx_lm.utils import _get_classes, quantize_model, save_config, save_model

    out.mkdir(parents=True, exist_ok=True)
    config = dict(ARCHS[arch])
    model_class, args_class = _get_classes(config)
    mx.random.seed(0)
    model = model_class(args_class.from_dict(config))
    mx.eval(model.parameters())
    if quantize:
        model, config = quantize_model(model, config, group_size=64, bits=4)
    save_model(out, model)
    save_config(config, out / "config.json")
    return out


def main() -> int:
    from mlxops.finetune.config import from_dict
    from mlxops.finetune.plan import estimate, read_model

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jsonl", type=Path)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        models = {("llama", False): build(Path(tmp) / "llama", "llama", False),
                  ("qwen2", True): build(Path(tmp) / "qwen2-4bit", "qwen2", True)}
        grid = itertools.product(models, ("lora", "dora", "full"), (128, 512), (1, 4),
                                 (False, True))
        for (arch, quantized), method, seq, micro, ckpt in grid:
            if method == "full" and quantized:
                continue  # mlx-lm trains no packed weights
            section = {"model": {"path": str(models[(arch, quantized)])},
                       "data": {"path": tmp},
                       "method": {"type": method, "num_layers": -1 if method == "full" else 2},
                       "train": {"max_seq_len": seq, "grad_checkpoint": ckpt}}
            cfg = from_dict(section)
            proc = subprocess.run([sys.executable, "-c", MEASURE, json.dumps(section),
                                   str(micro)], capture_output=True, text=True,
                                  cwd=ROOT, timeout=600)
            if proc.returncode:
                print(proc.stderr[-2000:], file=sys.stderr)
                return 1
            peak = json.loads(proc.stdout.strip().splitlines()[-1])["peak"]
            planned = max(estimate(read_model(cfg.model.path), cfg, micro)[1:])
            row = {"arch": arch, "quantized": quantized, "method": method, "seq": seq,
                   "micro": micro, "grad_checkpoint": ckpt, "peak": peak,
                   "planned": planned, "ratio": round(planned / peak, 3)}
            rows.append(row)
            print(f"{arch:6} {'4bit' if quantized else 'fp32'} {method:4} seq {seq:4} micro "
                  f"{micro} ckpt {'on ' if ckpt else 'off'} peak {peak / 2**20:7.1f} MB "
                  f"plan {planned / 2**20:7.1f} MB  x{row['ratio']:.2f}", flush=True)
    ratios = [r["ratio"] for r in rows]
    print(f"{len(rows)} configs: plan / peak median {statistics.median(ratios):.2f}, "
          f"{min(ratios):.2f} to {max(ratios):.2f}")
    if args.jsonl:
        args.jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
