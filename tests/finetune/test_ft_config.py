import json

import pytest

from mlxops.finetune.config import (
    ConfigError,
    FinetuneConfig,
    check_world,
    describe_options,
    diff_resume_keys,
    load_config,
    options,
)

BASE = {"model": {"path": "models/tiny"}, "data": {"path": "data/chat"}}


def test_defaults_and_file_values(tmp_path):
    p = tmp_path / "ft.json"
    p.write_text(json.dumps({**BASE, "method": {"type": "dora", "rank": 4,
                                                "keys": ["self_attn.q_proj"]},
                             "train": {"lr": 1}, "out": "runs/x"}))
    cfg = load_config(p)
    assert cfg.method.type == "dora" and cfg.method.rank == 4
    assert cfg.method.keys == ["self_attn.q_proj"] and cfg.method.scale == 20.0
    assert cfg.train.lr == 1.0 and isinstance(cfg.train.lr, float)
    assert cfg.train.global_batch == FinetuneConfig().train.global_batch
    assert cfg.out == "runs/x" and cfg.model.path == "models/tiny"


@pytest.mark.parametrize("data, error", [
    ({"data": {"path": "d"}}, "finetune: model.path: required"),
    ({"model": {"path": "m"}}, "finetune: data.path: required"),
    ({**BASE, "method": {"type": "qlora"}}, r"method.type: must be lora \| dora \| full"),
    ({**BASE, "method": {"rank": 0}}, "method.rank: must be positive, got 0"),
    ({**BASE, "method": {"dropout": 1.0}}, r"method.dropout: must be in \[0, 1\)"),
    ({**BASE, "method": {"num_layers": -2}}, "method.num_layers: must be positive or -1"),
    ({**BASE, "method": {"keys": "q_proj"}}, "method.keys: must be null or a list"),
    ({**BASE, "method": {"type": "full", "keys": ["q_proj"]}}, "method.keys: goes with"),
    ({**BASE, "train": {"optimizer": "lion"}}, "train.optimizer: must be adamw"),
    ({**BASE, "train": {"lr": "fast"}}, "train.lr: expected float"),
    ({**BASE, "train": {"stepz": 3}}, "finetune: train.stepz: unknown key"),
    ({**BASE, "train": {"patience": 2, "eval_every": 0}}, "train.patience: needs"),
    ({**BASE, "train": {"eval_batches": 0}}, "train.eval_batches: must be positive or -1"),
    ({**BASE, "train": {"balance": [1, -1]}}, "train.balance: must be equal, auto or"),
    ({**BASE, "train": {"grad_reduce_dtype": "int8"}}, "train.grad_reduce_dtype: must be"),
    ({**BASE, "trainer": {}}, "finetune: trainer: unknown key"),
    ({**BASE, "train": 3}, "finetune: train: must be a mapping"),
])
def test_bad_values_name_the_key(data, error):
    with pytest.raises(ConfigError, match=error):
        load_config(data)


def test_errors_name_the_file(tmp_path):
    p = tmp_path / "ft.json"
    p.write_text('{"model": {"path": "a", "path": "b"}}')
    with pytest.raises(ConfigError, match=r"ft\.json: model\.path: duplicate key"):
        load_config(p)
    with pytest.raises(ConfigError, match=r"job\.yml: finetune: train\.seed: must be >= 0"):
        load_config({**BASE, "train": {"seed": -1}}, where="job.yml: finetune")


def test_overrides_keep_strings_and_check_values():
    cfg = load_config(BASE, ["train.steps=40", "out=007", "method.keys=[\"mlp.up_proj\"]",
                             "data.path=123"])
    assert cfg.train.steps == 40 and cfg.out == "007" and cfg.data.path == "123"
    assert cfg.method.keys == ["mlp.up_proj"]
    with pytest.raises(ConfigError, match="--set: train.steps: must be positive"):
        load_config(BASE, ["train.steps=0"])
    with pytest.raises(ConfigError, match="--set: train.nope: unknown key"):
        load_config(BASE, ["train.nope=1"])


def test_world_rules():
    cfg = load_config({**BASE, "train": {"global_batch": 6}})
    check_world(cfg, 3)
    with pytest.raises(ConfigError, match="global_batch: 6 is not divisible by the world size 4"):
        check_world(cfg, 4)
    cfg = load_config({**BASE, "train": {"global_batch": 5, "balance": [3, 1]}})
    check_world(cfg, 2)
    with pytest.raises(ConfigError, match="2 weights for 3 ranks"):
        check_world(cfg, 3)


def test_resume_keys():
    saved = load_config(BASE).to_dict()
    moved = load_config({"model": {"path": "elsewhere"}, "data": {"path": "d2"},
                         "train": {"steps": 9, "micro_batch": 2, "balance": "auto"}})
    assert diff_resume_keys(saved, moved) == []  # paths and the split may change
    other = load_config({**BASE, "method": {"rank": 4}})
    assert diff_resume_keys(saved, other) == ["method.rank: checkpoint has 8, config has 4"]


def test_every_key_has_help_and_default():
    names = [name for name, _, _ in options()]
    assert "method.num_layers" in names and "train.patience" in names and names[-1] == "out"
    text = describe_options()
    for name in names:
        assert name in text


def test_docs_list_every_key_with_its_default():
    from pathlib import Path

    text = (Path(__file__).parents[2] / "docs" / "finetune.md").read_text()
    for name, default, _ in options():
        shown = f"`{default}`" if isinstance(default, str) else json.dumps(default)
        assert f"| `{name}` | {shown} |" in text, name


def test_help_lists_every_key(capsys):
    from mlxops.finetune.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    for name, _, _ in options():
        assert name in text
