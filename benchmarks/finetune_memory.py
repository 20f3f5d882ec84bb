"""The fine-tuning memory plan (mlxops/finetune/plan.py) against MLX's measured peak.

Each config is a real run of ``python -m mlxops.finetune`` (one rank, 3 steps, the
checkpoint at the end): a random model built with mlx-lm's own classes (llama, or qwen2
quantized to 4 bits as ``mlx_lm.convert -q`` does) with the tiny models' tokenizer
(mlxops/devtools/tinymodels.py), on text examples long enough to fill ``max_seq_len``
(the plan's worst case: every sequence at the cap). Its last ``metrics.jsonl`` line has
``peak_memory``, MLX's allocator's peak since the process started; the plan reads only
the model's files.

    python benchmarks/finetune_memory.py              # the grid below
    python benchmarks/finetune_memory.py --quick      # 6 configs
    python benchmarks/finetune_memory.py --jsonl out.jsonl
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
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
              "max_position_embeddings": 4096},
    "qwen2": {"model_type": "qwen2", "hidden_size": 256, "num_hidden_layers": 4,
              "intermediate_size": 704, "num_attention_heads": 8, "num_key_value_heads": 4,
              "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": True,
              "max_position_embeddings": 4096},
}


def build(out: Path, arch: str, quantize: bool) -> Path:
    import mlx.core as mx
    from mlx_lm.utils import _get_classes, quantize_model, save_config, save_model

    from mlxops.devtools.tinymodels import docstring_paragraphs, write_tokenizer

    out.mkdir(parents=True, exist_ok=True)
    vocab = write_tokenizer(out, [t for _, t in docstring_paragraphs()])
    config = dict(ARCHS[arch], vocab_size=vocab)
    model_class, args_class = _get_classes(config)
    mx.random.seed(0)
    model = model_class(args_class.from_dict(config))
    mx.eval(model.parameters())
    if quantize:
        model, config = quantize_model(model, config, group_size=64, bits=4)
    save_model(out, model)
    save_config(config, out / "config.json")
    return out


def long_texts(out: Path) -> Path:
    """``train.jsonl``: texts of every docstring joined, longer than any max_seq_len here."""
    from mlxops.devtools.tinymodels import docstring_paragraphs

    out.mkdir(parents=True, exist_ok=True)
    words = " ".join(t for _, t in docstring_paragraphs())
    rows = [{"text": words[i:] + " " + words[:i]} for i in range(0, 64 * 97, 97)]
    (out / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


def main() -> int:
    from mlxops.finetune.config import from_dict
    from mlxops.finetune.plan import estimate, read_model

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="6 configs")
    ap.add_argument("--jsonl", type=Path)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        models = {("llama", False): build(Path(tmp) / "llama", "llama", False),
                  ("qwen2", True): build(Path(tmp) / "qwen2-4bit", "qwen2", True)}
        data = long_texts(Path(tmp) / "data")
        grid = list(itertools.product(models, ("lora", "dora", "full"), (128, 512), (1, 4),
                                      (False, True)))
        if args.quick:
            grid = [g for g in grid if g[3] == 4 and g[4] is False and g[2] == 512]
        for (arch, quantized), method, seq, micro, ckpt in grid:
            if method == "full" and quantized:
                continue  # mlx-lm trains no packed weights
            out = Path(tmp) / "run"
            section = {"model": {"path": str(models[(arch, quantized)])},
                       "data": {"path": str(data)},
                       "method": {"type": method, "num_layers": -1 if method == "full" else 2},
                       "train": {"max_seq_len": seq, "grad_checkpoint": ckpt, "steps": 3,
                                 "global_batch": micro, "eval_every": 0, "log_every": 1,
                                 "checkpoint_every": 0, "micro_batch": micro,
                                 "consistency_every": 0},
                       "out": str(out)}
            config = Path(tmp) / "finetune.json"
            config.write_text(json.dumps(section))
            subprocess.run(["rm", "-rf", str(out)], check=True)
            proc = subprocess.run([sys.executable, "-m", "mlxops.finetune", "--config",
                                   str(config)], capture_output=True, text=True, cwd=ROOT,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=900)
            if proc.returncode:
                print(proc.stdout[-2000:] + proc.stderr[-2000:], file=sys.stderr)
                return 1
            last = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
            peak = last["peak_memory"]
            cfg = from_dict(section)
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
