"""The rank environment: what the controller writes into a rank's start script is what the
trainer and the bench's ranks read back; a variable that does not read is named."""

from __future__ import annotations

from dataclasses import fields

import pytest

from mlxops.node.protocol.rankenv import VARIABLES, RankEnv

FULL = RankEnv(world_size=4, local_rank=1, backend="ring", run_dir="/r/runs/j", resume=True,
               host="mac2")


@pytest.mark.parametrize("env", [FULL, RankEnv(resume=False), RankEnv()],
                         ids=["full", "resume-0", "none"])
def test_the_environment_survives_the_start_script(env):
    assert RankEnv.from_env(env.to_env()) == env


def test_every_field_has_its_variable():
    assert set(VARIABLES) == {f.name for f in fields(RankEnv)}
    assert set(FULL.to_env()) == set(VARIABLES.values())
    assert FULL.to_env()["MLXOPS_RESUME"] == "1"


def test_an_empty_variable_is_not_set():
    assert RankEnv.from_env({"MLXOPS_WORLD_SIZE": "", "MLXOPS_HOST": ""}) == RankEnv()


@pytest.mark.parametrize("variable,value", [("MLXOPS_WORLD_SIZE", "four"),
                                            ("MLXOPS_LOCAL_RANK", "1.5"),
                                            ("MLXOPS_RESUME", "yes")])
def test_a_variable_that_does_not_read_is_named(variable, value):
    with pytest.raises(ValueError, match=f"{variable}={value!r}"):
        RankEnv.from_env({**FULL.to_env(), variable: value})
