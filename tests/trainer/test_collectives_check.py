"""The collectives check's rank program (mlxops/node/collectives.py) on real local ring
ranks: right answers pass, and a fault injected on one rank (its all_gather's rows swapped,
a sum or a sent value changed) is named with the rank and what came back wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trainer_procs import PY, run_script

from mlxops.node.collectives import faults
from mlxops.node.protocol.collectives import (
    COLLECTIVES,
    FAULT_ENV,
    CollectivesAnswer,
    collectives_result,
)
from mlxops.node.protocol.decode import ProtocolError


def _check(tmp: Path, ranks: int, fault: str = "") -> list[CollectivesAnswer]:
    env = {"MLXOPS_WORLD_SIZE": str(ranks), "MLXOPS_BACKEND": "ring",
           "MLXOPS_RUN_DIR": str(tmp), FAULT_ENV: fault}
    proc = run_script([PY, "-m", "mlxops.node.collectives", "--ops", *COLLECTIVES],
                      ranks=ranks, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [CollectivesAnswer.from_dict(json.loads((tmp / collectives_result(r)).read_text()))
            for r in range(ranks)]


@pytest.mark.parametrize("ranks", [2, 3])
def test_right_answers_pass_every_collective(tmp_path, ranks):
    answers = _check(tmp_path, ranks)
    for r, a in enumerate(answers):
        assert (a.rank, a.world_size, a.backend, a.ok) == (r, ranks, "ring", True), a.wrong
        assert a.mlx
        assert "all_gather bfloat16 x 262147" in a.checked
        assert "send_recv float32 x 1031" in a.checked
        assert "all_sum float32 x 262147" in a.checked


def test_an_all_gather_in_the_wrong_order_is_named(tmp_path):
    answers = _check(tmp_path, 3, "all_gather:1")
    assert answers[0].ok and answers[2].ok
    assert "all_gather float32 x 1031: rank 1 got rank 1's values where rank 0's belong " \
        "(order wrong)" in answers[1].wrong
    assert any(w.startswith("all_gather bfloat16 x 262147") for w in answers[1].wrong)


def test_a_corrupted_send_and_sum_are_named(tmp_path):
    answers = _check(tmp_path, 3, "send_recv:2,all_sum:0")
    # rank 2 sends to its right neighbour, rank 0
    assert "send_recv float32 x 1031: rank 0 received 1 of 1031 values from rank 2 wrong " \
        "(element 515: 132, want 131)" in answers[0].wrong
    # element 131073: 6 x (1 + 131073 % 7) = 36, and the fault's 1
    assert "all_sum float32 x 262147: 1 of 262147 sums wrong on rank 0 (element 131073: " \
        "37, want 36)" in answers[0].wrong
    assert answers[1].ok and answers[2].ok


def test_the_fault_hook_and_the_answer_decoder():
    assert faults({FAULT_ENV: "all_gather:1, send_recv:0"}) == {("all_gather", 1),
                                                                 ("send_recv", 0)}
    assert faults({}) == set()
    with pytest.raises(ProtocolError, match=r"CollectivesAnswer: no 'mlx'"):
        CollectivesAnswer.from_dict({"rank": 0, "world_size": 2, "backend": "ring",
                                     "checked": []})
