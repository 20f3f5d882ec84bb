"""Fine-tuning's memory and disk plans (mlxops/finetune/plan.py) against a real run.

Each case is a run of ``python -m mlxops.finetune`` (one rank, 2 steps of 4 examples of
256 tokens, the checkpoint at the end) on a model built by mlxops/devtools/tinymodels.py
at the sizes of ``benchmarks/finetune_memory.py`` (4 blocks, 256 wide, 4 of 8 key-value
heads: the tiny test models' 64-wide blocks are too small for the activations to be what
the plan is about), on texts longer than ``max_seq_len`` (the plan's case: every example
at the cap). ``check --job`` decides with these plans, so they are held to the bundled
trainer's bounds (tests/trainer/test_plan.py): the planned peak within 15% of MLX's
measured ``peak_memory`` and never more than 10% below it; the disk plan's bytes of a
checkpoint within 2% of the files a real checkpoint holds (their safetensors; the JSON
beside them is a few hundred bytes).
"""

from __future__ import annotations

import json

import pytest
from ft_procs import ok, run_finetune

from mlxops.devtools.tinymodels import build_model, docstring_paragraphs
from mlxops.finetune.config import from_dict
from mlxops.finetune.plan import plan_disk, plan_finetune, read_model
from mlxops.node import protocol

#: Within 15% of the measured peak and never more than 10% below it (the trainer's).
ABOVE, BELOW = 0.15, 0.10
#: benchmarks/finetune_memory.py's model sizes.
SIZES = {"hidden_size": 256, "num_hidden_layers": 4, "intermediate_size": 704,
         "num_attention_heads": 8, "num_key_value_heads": 4}
SEQ, STEPS = 256, 2

CASES = {  # name: (model, method section)
    "lora": ("llama", {"type": "lora", "num_layers": 2}),
    "dora": ("llama", {"type": "dora", "num_layers": 2}),
    "full": ("llama", {"type": "full", "num_layers": -1}),
    "4-bit lora": ("qwen2-4bit", {"type": "lora", "num_layers": 2}),
}


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("planned")
    models = {"llama": build_model(root / "llama", "llama", sizes=SIZES),
              "qwen2-4bit": build_model(root / "qwen2-4bit", "qwen2", quantize=True,
                                        sizes=SIZES)}
    data = root / "data"
    data.mkdir()
    words = " ".join(text for _, text in docstring_paragraphs())
    rows = [{"text": words[i:] + " " + words[:i]} for i in range(0, 16 * 97, 97)]
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return models, data


@pytest.mark.parametrize("name", CASES)
def test_the_plans_hold_a_real_run(made, tmp_path, name):
    models, data = made
    arch, method = CASES[name]
    section = {"model": {"path": str(models[arch])}, "data": {"path": str(data)},
               "method": method,
               "train": {"max_seq_len": SEQ, "steps": STEPS, "global_batch": 4,
                         "micro_batch": 4, "eval_every": 0, "log_every": 1,
                         "checkpoint_every": 0, "consistency_every": 0},
               "out": str(tmp_path / "out")}
    config = tmp_path / "finetune.json"
    config.write_text(json.dumps(section))
    ok(run_finetune(config))
    last = json.loads((tmp_path / "out" / protocol.METRICS).read_text().splitlines()[-1])
    cfg, shape = from_dict(section), read_model(models[arch])

    plan = plan_finetune(cfg, shape, 1 << 40, 1)   # room for the config as it ran
    assert (plan.micro_batch, plan.accumulation, plan.grad_checkpoint) == (4, 1, False)
    assert (last["micro_batch"], last["accumulation"]) == (4, 1)
    planned, peak = plan.total_bytes, last["peak_memory"]
    assert (1 - BELOW) * peak <= planned <= (1 + ABOVE) * peak, (
        f"{name}: planned {planned / 1e6:.1f} MB, measured peak {peak / 1e6:.1f} MB "
        f"({planned / peak:.3f})")

    step = tmp_path / "out" / protocol.CKPT_DIR / protocol.checkpoint_name(STEPS)
    written = sum(f.stat().st_size for f in step.iterdir() if f.suffix == ".safetensors")
    disk = plan_disk(shape, cfg)
    assert abs(disk.checkpoint_bytes - written) <= 0.02 * written, (
        f"{name}: planned {disk.checkpoint_bytes} bytes a checkpoint, wrote {written}")
