"""Fine-tuning's memory plan (mlxops/finetune/plan.py), from a model's own files.

The models here are safetensors headers written by tests/unit/model_files.py
(illustrative shapes, not a real model's: a llama-like block of D=64, F=128, 4 heads, 2 kv
heads, vocabulary 512, as mlxops/devtools/tinymodels.py builds), with zero bytes for the
data: the plan reads only ``config.json`` and the headers.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from model_files import LINEARS, D, F, V, write_model

from mlxops.finetune.config import from_dict
from mlxops.finetune.plan import ModelError, adapted, estimate, plan_finetune, read_model


def cfg(model: Path, **sections):
    body = {"model": {"path": str(model)}, "data": {"path": "d"}}
    for key, value in sections.items():
        body[key] = value
    return from_dict(body)


BLOCK_PARAMS = sum(o * i for o, i in LINEARS.values()) + 2 * D


def test_the_models_shape_comes_from_its_headers(tmp_path):
    shape = read_model(write_model(tmp_path / "m"))
    assert shape.params == V * D + D + 2 * BLOCK_PARAMS
    assert shape.base_bytes == 4 * shape.params
    assert (shape.dims, shape.layers, shape.heads, shape.vocab, shape.mlp) == (D, 2, 4, V, F)
    assert shape.activation_bytes == 4 and shape.quantized_bits is None
    assert {(x.path, x.inputs, x.outputs) for x in shape.linears if x.block == 1} == {
        (p, i, o) for p, (o, i) in LINEARS.items()}


def test_a_quantized_model_is_unpacked_for_its_widths_and_counted_packed_for_its_bytes(tmp_path):
    plain = read_model(write_model(tmp_path / "plain", dtype="BF16"))
    packed = read_model(write_model(tmp_path / "q4", bits=4, dtype="BF16"))
    assert packed.quantized_bits == 4 and packed.activation_bytes == 2
    assert packed.params == plain.params
    assert {(x.path, x.inputs) for x in packed.linears} == {(x.path, x.inputs)
                                                            for x in plain.linears}
    # 4 bits a weight plus a bfloat16 scale and bias per group of 32: 5/16 of bfloat16's.
    weights = V * D + 2 * (BLOCK_PARAMS - 2 * D)
    assert packed.base_bytes == weights // 2 + 2 * 2 * weights // 32 + 2 * (D + 4 * D)
    assert packed.base_bytes < plain.base_bytes / 3


def test_what_trains_per_method(tmp_path):
    model = write_model(tmp_path / "m", layers=3)
    shape = read_model(model)
    lora = cfg(model, method={"type": "lora", "rank": 4, "num_layers": 2})
    per_block = sum(4 * (i + o) for o, i in LINEARS.values())
    assert len(adapted(shape, lora)) == 14
    plan = plan_finetune(lora, shape, 2**34, 1)
    assert (plan.trainable_params, plan.trainable_bytes) == (2 * per_block, 8 * per_block)
    assert plan.optimizer_bytes == 2 * plan.trainable_bytes   # AdamW's two moments
    keys = cfg(model, method={"rank": 4, "num_layers": 1, "keys": ["self_attn.q_proj"]})
    assert plan_finetune(keys, shape, 2**34, 1).trainable_params == 4 * (D + D)
    dora = cfg(model, method={"type": "dora", "rank": 4, "num_layers": 2})
    outputs = 2 * sum(o for o, _ in LINEARS.values())
    assert plan_finetune(dora, shape, 2**34, 1).trainable_params == 2 * per_block + outputs
    full = cfg(model, method={"type": "full", "num_layers": -1}, train={"optimizer": "sgd"})
    plan = plan_finetune(full, shape, 2**34, 1)
    assert plan.trainable_params == 3 * BLOCK_PARAMS
    assert plan.optimizer_bytes == plan.trainable_bytes


def test_activations_grow_with_the_sequence_and_checkpointing_cuts_them(tmp_path):
    model = write_model(tmp_path / "m")
    shape = read_model(model)
    short = estimate(shape, cfg(model, train={"max_seq_len": 128}), micro=2)
    long = estimate(shape, cfg(model, train={"max_seq_len": 1024}), micro=2)
    assert short[0] == long[0] and long[1] - long[0] > 8 * (short[1] - short[0])
    ckpt = estimate(shape, cfg(model, train={"max_seq_len": 1024, "grad_checkpoint": True}),
                    micro=2)
    assert ckpt[1] < long[1]


def test_a_node_too_small_gets_more_accumulation_then_checkpointing_then_no(tmp_path):
    model = write_model(tmp_path / "m")
    shape = read_model(model)
    c = cfg(model, train={"global_batch": 16, "micro_batch": 8, "max_seq_len": 2048})
    roomy = plan_finetune(c, shape, 2**36, 2)
    assert (roomy.micro_batch, roomy.accumulation, roomy.grad_checkpoint, roomy.fits) == (
        8, 1, False, True)
    one = max(estimate(shape, c, 1, 2, False)[1:])
    tight = plan_finetune(c, shape, int(one / 0.8) + 1, 2)     # 80% of RAM: the CPU budget
    assert (tight.micro_batch, tight.accumulation, tight.fits) == (1, 8, True)
    tiny = plan_finetune(c, shape, 1, 2)
    assert not tiny.fits and tiny.grad_checkpoint


def test_a_directory_that_is_not_a_model_is_named(tmp_path):
    with pytest.raises(ModelError, match="config.json"):
        read_model(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelError, match="no \\*.safetensors"):
        read_model(tmp_path)


def test_mlxops_plan_plans_a_finetune_job_per_node_from_cached_facts(tmp_path, monkeypatch):
    from dataclasses import replace

    import yaml

    from mlxops.cli.plan import plan_notes
    from mlxops.hostfacts import HostFacts
    from mlxops.jobs.spec import load_job
    from mlxops.planning import plan_job, step_estimate
    from mlxops.tasks.facts import save_facts
    from mlxops.transport import Connector

    monkeypatch.setenv("MLXOPS_HOME", str(tmp_path / "home"))
    model = write_model(tmp_path / "m", bits=4, dtype="BF16")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "train.jsonl").write_text("")
    (tmp_path / "inv.yml").write_text(yaml.safe_dump({"all": {"hosts": {
        "a": {"ansible_host": "10.0.0.1", "mlxops_slots": 2},
        "b": {"ansible_host": "10.0.0.2"}}}}))
    (tmp_path / "job.yml").write_text(yaml.safe_dump({
        "name": "ft", "inventory": "inv.yml", "finetune": {
            "model": {"path": "m"}, "data": {"path": "d"}, "method": {"rank": 4},
            "train": {"global_batch": 6, "eval_every": 0, "max_seq_len": 256}}}))
    for host, gb in (("a", 64), ("b", 8)):   # illustrative sizes, cached as provision would
        save_facts(host, replace(HostFacts.unknown(), memory_bytes=gb * 2**30, system="Linux"))
    spec = load_job(tmp_path / "job.yml")
    with Connector() as connector:   # every host's facts are cached: nothing is asked
        plans, results = plan_job(spec, connector)
    assert results.exit_code == 0 and [p.host for p in plans] == ["a", "b"]
    a, b = (p.plan for p in plans)
    assert (a.world_size, a.micro_batch, a.quantized_bits, a.seq_len) == (3, 2, 4, 256)
    assert a.budget_bytes == int(64 * 2**30 * 0.8) // 2 and b.budget_bytes == int(8 * 2**30 * 0.8)
    assert a.base_bytes == read_model(model).base_bytes and a.fits and b.fits
    step = step_estimate(spec, plans)
    assert step["gradient_bytes"] == a.trainable_bytes   # the all-reduce: adapters only
    notes = plan_notes(plans)
    assert any(n.startswith("per rank: base weights 4-bit, ") for n in notes), notes
    assert any("activations at 256 tokens x micro-batch 2" in n for n in notes), notes
