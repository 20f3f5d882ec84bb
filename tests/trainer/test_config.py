import json
from pathlib import Path

import pytest
import yaml

from mlxops.trainer.config import (
    ConfigError,
    check_world,
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


DATA = Path(__file__).parent / "data" / "config"
EXPECTED = yaml.safe_load((DATA / "expected.yml").read_text())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_bad_config_files_get_one_line_naming_file_and_key(name):
    path = DATA / name
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == EXPECTED[name].replace("FILE", str(path))


def test_every_config_data_file_is_a_case():
    assert {p.name for p in DATA.iterdir()} == {*EXPECTED, "expected.yml", "merged.yml"}


def test_merge_keys_load_with_the_mappings_own_keys_winning():
    cfg = load_config(DATA / "merged.yml")
    assert (cfg.train.steps, cfg.train.lr, cfg.train.warmup) == (5, 0.5, 1)


def test_check_world_is_the_rule_for_the_global_batch():
    cfg = load_config({"train": {"global_batch": 12, "micro_batch": 8}})
    for world in (1, 2, 3, 4, 6, 12):
        check_world(cfg, world)
    for world in (5, 8, 24):
        with pytest.raises(ConfigError, match=rf"^job: train\.global_batch: 12 is not "
                                              rf"divisible by the world size {world} "):
            check_world(cfg, world, where="job")
    with pytest.raises(ConfigError, match="world size must be at least 1"):
        check_world(cfg, 0)
