"""A fine-tuning rank beats while it starts (loads the base model, compiles its first
step), as the bundled trainer's does (trainer/startbeat.py): the watchdog and the alerts
see it alive before its first step; the loop's own heartbeat takes over there."""

from __future__ import annotations

import json

from ft_procs import write_config

from mlxops.finetune import train
from mlxops.finetune.config import load_config
from mlxops.node import protocol


def test_a_finetuning_rank_has_a_starting_heartbeat_before_its_first_step(
        tiny, tmp_path, monkeypatch):
    out = tmp_path / "out"
    config = write_config(tmp_path, out, tiny.llama, tiny.data["chat"],
                          train={"steps": 2, "eval_every": 0, "checkpoint_every": 0})
    tuner = train.finetune_loop(load_config(str(config)), resume=False)
    path = out / protocol.progress_file(0)
    seen = []
    real = tuner._run_step

    def first_steps(*args, **kwargs):  # what the watchdog reads while the step compiles
        seen.append(json.loads(path.read_text()))
        return real(*args, **kwargs)

    monkeypatch.setattr(tuner, "_run_step", first_steps)
    tuner.run()
    assert seen[0]["state"] == protocol.STARTING and seen[0]["step"] is None
    assert seen[1]["state"] == protocol.RUNNING and seen[1]["step"] == 1
    assert json.loads(path.read_text())["state"] == protocol.FINISHED
