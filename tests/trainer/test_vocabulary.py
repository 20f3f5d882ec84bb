"""One vocabulary for the bundled trainer's and fine-tuning's configs (trainer/vocabulary.py):
the same key, the same meaning; an old or misspelt key refused with the key meant."""

from __future__ import annotations

import dataclasses
import json

import pytest

from mlxops.finetune import config as ftconfig
from mlxops.trainer import config as trconfig
from mlxops.trainer.configfile import ConfigError
from mlxops.trainer.vocabulary import RENAMED, TrainKeys, upgrade

FT = {"model": {"path": "m"}, "data": {"path": "d"}}


def test_both_configs_take_every_shared_key_with_its_meaning():
    shared = {f.name: f.metadata["help"] for f in dataclasses.fields(TrainKeys)}
    for section in (trconfig.TrainConfig, ftconfig.TrainSection):
        fields = {f.name: f for f in dataclasses.fields(section)}
        assert set(shared) <= set(fields), section
        for name, help in shared.items():
            # the same meaning: a program's help may only say more
            assert fields[name].metadata["help"].startswith(help), (section, name)
    assert not hasattr(ftconfig.FinetuneConfig(), "optimizer")


@pytest.mark.parametrize(("old", "new"), sorted(RENAMED.items()))
def test_an_old_key_names_the_key_that_replaced_it(tmp_path, old, new):
    section, key = old.split(".")
    path = tmp_path / "finetune.json"
    path.write_text(json.dumps({**FT, section: {key: 1}}))
    with pytest.raises(ConfigError) as err:
        ftconfig.load_config(path)
    assert str(err.value).startswith(f"{path}: {old}: unknown key; did you mean {new[0]}?")
    assert "\n" not in str(err.value)


def test_a_misspelt_key_names_the_closest():
    with pytest.raises(ConfigError, match=r"^trainer: train\.chekpoint_every: unknown key; "
                                          r"did you mean train\.checkpoint_every\?$"):
        trconfig.load_config({"train": {"chekpoint_every": 5}})
    with pytest.raises(ConfigError, match=r"^--set: train\.micro_bach: unknown key; did you "
                                          r"mean train\.micro_batch\?$"):
        ftconfig.load_config(FT, ["train.micro_bach=2"])
    with pytest.raises(ConfigError, match=r"^trainer: train\.zzz: unknown key$"):
        trconfig.load_config({"train": {"zzz": 1}})


def test_a_checkpoint_saved_with_the_old_spelling_resumes():
    """A fine-tuning checkpoint's config from before (optimizer: section, save_every)
    compares equal to the same config written now; a changed value is still named."""
    now = ftconfig.load_config({**FT, "train": {"lr": 2e-4, "optimizer": "sgd",
                                                "checkpoint_every": 7}})
    saved = now.to_dict()
    train = saved["train"]
    saved["optimizer"] = {"name": train.pop("optimizer"), "lr": train.pop("lr"),
                          "min_lr": train.pop("min_lr"), "schedule": train.pop("schedule"),
                          "warmup": train.pop("warmup"),
                          "weight_decay": train.pop("weight_decay"),
                          "grad_clip": train.pop("grad_clip")}
    train["save_every"] = train.pop("checkpoint_every")
    assert upgrade(saved)["train"]["lr"] == 2e-4
    assert ftconfig.diff_resume_keys(saved, now) == []
    saved["optimizer"]["lr"] = 1e-3
    assert ftconfig.diff_resume_keys(saved, now) == [
        "train.lr: checkpoint has 0.001, config has 0.0002"]


def test_the_programs_keep_their_defaults():
    tr, ft = trconfig.TrainerConfig().train, ftconfig.load_config(FT).train
    assert (tr.optimizer, tr.schedule, tr.lr, tr.micro_batch) == ("adamw", "cosine", 3e-4, 8)
    assert (ft.optimizer, ft.schedule, ft.lr, ft.micro_batch) == ("adamw", "constant", 1e-5, 4)
