"""A rank beats while it starts (loads, compiles its first step: 40 s cold on a Mac), so the
watchdog and the alerts see it alive before its first step; the loop's own heartbeat takes
over at that step and the starting beat never writes again (trainer/startbeat.py)."""

from __future__ import annotations

import json
import threading

from trainer_procs import TINY

from mlxops.node import protocol
from mlxops.trainer import train
from mlxops.trainer.config import load_config
from mlxops.trainer.startbeat import StartBeat


def test_the_beat_writes_until_stopped_and_never_after():
    beats, again = [], threading.Event()

    def beat():
        beats.append(1)
        if len(beats) == 2:
            again.set()

    started = StartBeat(beat, every=0.01).start()
    assert beats  # the first at once, before start() returns
    assert again.wait(30)  # then from the thread
    started.stop()
    stopped_at = len(beats)
    started._thread.join(30)
    assert not started._thread.is_alive() and len(beats) == stopped_at


def test_a_rank_has_a_starting_heartbeat_before_its_first_step_and_a_step_after(
        tmp_path, monkeypatch):
    cfg = json.loads(json.dumps(TINY))
    cfg["train"].update({"steps": 2, "log_every": 1, "checkpoint_every": 0})
    cfg["out"] = str(tmp_path / "out")
    trainer = train.trainer_loop(load_config(cfg), resume=False)
    path = tmp_path / "out" / protocol.progress_file(0)
    seen = []
    real = trainer._run_step

    def first_steps(step, timed):  # what the watchdog reads while the step compiles
        seen.append(json.loads(path.read_text()))
        return real(step, timed)

    monkeypatch.setattr(trainer, "_run_step", first_steps)
    trainer.run()
    assert seen[0]["state"] == protocol.STARTING and seen[0]["step"] is None
    assert seen[1]["state"] == protocol.RUNNING and seen[1]["step"] == 1
    assert not trainer._starting._thread.is_alive()
    final = json.loads(path.read_text())
    assert final["state"] == protocol.FINISHED and final["step"] == 2
