"""The trainer's hold hook (``MLXOPS_TRAINER_HOLD``, mlxops/trainer/hooks.py): what the
job tests use to keep a job at a step however fast the machine is. No clock here: the
heartbeat callback is what lets the held rank go."""

from __future__ import annotations

import pytest

from mlxops.trainer import hooks


@pytest.fixture
def hold_file(tmp_path, monkeypatch):
    path = tmp_path / "hold"
    monkeypatch.setenv("MLXOPS_TRAINER_HOLD", str(path))
    monkeypatch.setattr(hooks, "HOLD_POLL", 0)
    return path


def test_no_variable_or_no_file_never_holds(hold_file, monkeypatch):
    beats = []
    hooks.hold(5, lambda: beats.append(1))  # the file is not there
    monkeypatch.delenv("MLXOPS_TRAINER_HOLD")
    hold_file.write_text("5")
    hooks.hold(5, lambda: beats.append(1))
    assert beats == []


def test_a_later_step_in_the_file_lets_the_step_before_it_pass(hold_file):
    hold_file.write_text("6\n")
    beats = []
    hooks.hold(5, lambda: beats.append(1))
    assert beats == []


def test_the_rank_waits_at_the_step_beating_until_the_file_says_a_later_one(hold_file):
    hold_file.write_text("5")
    beats = []

    def beat():
        beats.append(1)
        if len(beats) == 3:
            hold_file.write_text("9")

    hooks.hold(7, beat)  # held at 5 or later: 7 waits too
    assert len(beats) == 3


def test_a_file_being_written_holds_and_removing_it_lets_go(hold_file):
    hold_file.write_text("")  # not a number yet
    beats = []

    def beat():
        beats.append(1)
        if len(beats) == 2:
            hold_file.unlink()

    hooks.hold(1, beat)
    assert len(beats) == 2
