"""The plan that brings a run's checkpoint parts together (mlxops/jobs/ckptplan.py):
given what each node says it holds, the step resumed from and what is copied where."""

from __future__ import annotations

import pytest

from mlxops.jobs.ckptplan import PlanError, plan
from mlxops.node.protocol.parts import STAGE, ZERO, CkptPart

#: The old run's layers per stage: stage 0 [0, 2), stage 1 [2, 3), stage 2 [3, 6).
OLD = [2, 1, 3]


def stage(s: int, step: int, world: int = 3) -> CkptPart:
    path = f"stage-{s}/step-{step:08d}"
    first = sum(OLD[:s]) if world == 3 else 3 * s
    end = first + (OLD[s] if world == 3 else 3)
    return CkptPart(STAGE, s, world, step, path, {f"{path}/model.safetensors": 100},
                    [first, end])


def zslice(r: int, step: int, world: int = 3) -> CkptPart:
    path = f"step-{step:08d}/zero-rank-{r}.safetensors"
    return CkptPart(ZERO, r, world, step, path, {path: 10})


def lines(p) -> list[str]:
    return [c.line() for c in p.copies]


def test_stages_a_node_gets_the_old_stages_its_new_layers_and_place_need():
    # 3 stages on m1 m2 m3 split [2, 1, 3], resumed on m1 m3 as [3, 3] (m2 left out but
    # answering): m1's layers 0-2 were stages 0 and 1's; m3's 3-5 stage 2's, and as stage
    # 1 it finds its step in stage-1/.
    held = {"m1": [stage(0, 2), stage(0, 3)], "m3": [stage(2, 2), stage(2, 3)],
            "m2": [stage(1, 2), stage(1, 3)]}
    p = plan(held, ["m1", "m3"], {2, 3}, split=[3, 3])
    assert p.step == 3
    assert lines(p) == ["stage-1/step-00000003: m2 -> m1, m3"]
    assert p.bytes() == 100 * 3
    # The same split again: each node holds its own stage, nothing travels.
    assert plan(held, ["m1", "m2", "m3"], {2, 3}, split=OLD).copies == ()
    # [1, 5]: m3 (layers 1-5) needs every stage; m1 (layer 0) stage 0 only.
    assert lines(plan(held, ["m1", "m3"], {3}, split=[1, 5])) == [
        "stage-0/step-00000003: m1 -> m3", "stage-1/step-00000003: m2 -> m3"]
    # No split known (or layers unknown): every node of the run gets every stage.
    assert lines(plan(held, ["m1", "m3"], {3})) == [
        "stage-0/step-00000003: m1 -> m3", "stage-1/step-00000003: m2 -> m1, m3",
        "stage-2/step-00000003: m3 -> m1"]


def test_stages_the_newest_step_whose_parts_all_answer_and_a_run_node_preferred():
    # m2 (left out) kept only step 2 of its stage; m1 already has a copy of stage 1 at 2.
    held = {"m1": [stage(0, 2), stage(0, 3), stage(1, 2)], "m3": [stage(2, 2), stage(2, 3)],
            "m2": [stage(1, 2)]}
    p = plan(held, ["m1", "m3"], {2, 3}, split=[3, 3])
    assert p.step == 2
    assert lines(p) == ["stage-1/step-00000002: m1 -> m3"]


def test_nothing_to_copy_when_every_node_holds_every_part():
    held = {h: [stage(s, 4, 2) for s in range(2)] for h in ("a", "b")}
    assert plan(held, ["a", "b"], {4}, split=[1, 5]).copies == ()


def test_a_part_no_answering_node_holds_is_refused_naming_it_and_the_silent_node():
    held = {"m1": [stage(0, 3)], "m3": [stage(2, 3)]}
    with pytest.raises(PlanError) as err:
        plan(held, ["m1", "m3"], {3}, silent={"m2": "unreachable: timed out"})
    assert str(err.value) == (
        "no checkpoint to resume from has all its parts: step-00000003: stage 1's checkpoint"
        " (of 3) is on no node that answered (m2: unreachable: timed out)")


def test_zero_a_slice_held_on_no_run_node_goes_to_the_first_node_only():
    # 3 ranks on a b c, each node its own slice; c left out.
    held = {"a": [zslice(0, 5)], "b": [zslice(1, 5)], "c": [zslice(2, 5)]}
    p = plan(held, ["a", "b"], {5})
    assert p.step == 5
    assert lines(p) == ["step-00000005/zero-rank-2.safetensors: c -> a"]


def test_zero_and_data_parallel_steps_without_parts_need_nothing():
    assert plan({"a": [], "b": []}, ["a", "b"], {3, 7}).step == 7
    assert plan({"a": [], "b": []}, ["a", "b"], set()).step is None
    held = {"a": [zslice(0, 5, 2)], "b": [zslice(1, 5, 2)]}
    assert plan(held, ["a", "b"], {5}).copies == ()
