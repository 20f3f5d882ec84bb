import json

import pytest

from mlxops.trainer.config import (
    ConfigError,
    default_config,
    describe_options,
    diff_resume_keys,
    load_config,
)


def test_defaults_and_file_values(tmp_path):
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"model": {"dims": 64}, "train": {"lr": 1}, "out": "x"}))
    cfg = load_config(p)
    assert cfg.model.dims == 64 and cfg.model.layers == default_config().model.layers
    assert cfg.train.lr == 1.0 and isinstance(cfg.train.lr, float)
    assert cfg.out == "x"


def test_unknown_key_names_file_and_key(tmp_path):
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"train": {"stepz": 3}}))
    with pytest.raises(ConfigError, match=r"t\.json: train\.stepz: unknown key"):
        load_config(p)
    with pytest.raises(ConfigError, match="trainer: optim: unknown key"):
        load_config({"optim": {}})


def test_type_and_value_errors():
    with pytest.raises(ConfigError, match="model.dims: expected int"):
        load_config({"model": {"dims": "big"}})
    with pytest.raises(ConfigError, match="model.heads"):
        load_config({"model": {"dims": 30, "heads": 4}})
    with pytest.raises(ConfigError, match="data.path: required"):
        load_config({"data": {"source": "text"}})


def test_overrides():
    cfg = load_config({}, ["train.steps=40", "train.dtype=bfloat16", "out=runs/x",
                           "data.path=007", "data.source=text"])
    assert cfg.train.steps == 40 and cfg.train.dtype == "bfloat16"
    assert cfg.out == "runs/x" and cfg.data.path == "007"
    with pytest.raises(ConfigError, match="--set: train.nope: unknown key"):
        load_config({}, ["train.nope=1"])


def test_resume_diff_names_the_key():
    saved = default_config().to_dict()
    cfg = load_config({"model": {"dims": 128}, "train": {"steps": 5, "micro_batch": 1}})
    diff = diff_resume_keys(saved, cfg)
    assert diff == ["model.dims: checkpoint has 256, config has 128"]


def test_help_lists_every_key():
    text = describe_options()
    for key in ("model.dims", "data.source", "train.grad_checkpoint", "train.keep", "out"):
        assert key in text


def test_yaml_when_available(tmp_path):
    pytest.importorskip("yaml")
    p = tmp_path / "t.yml"
    p.write_text("model: {dims: 64, heads: 4}\ntrain: {steps: 3}\n")
    assert load_config(p).train.steps == 3
