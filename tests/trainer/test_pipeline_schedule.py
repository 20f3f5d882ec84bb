"""The 1F1B schedule (mlxops/trainer/schedule.py): every micro-batch once each way, the
activations held at most ``S - s``, and neighbours meeting their messages in one order."""

from __future__ import annotations

import pytest

from mlxops.trainer import schedule as sch


@pytest.mark.parametrize("stages", range(1, 10))
@pytest.mark.parametrize("micro", range(1, 10))
def test_every_micro_batch_goes_forward_then_back_once_in_order(stages, micro):
    for s in range(stages):
        ops = sch.schedule(s, stages, micro)
        fwd = [o.micro for o in ops if o.kind == sch.FORWARD]
        bwd = [o.micro for o in ops if o.kind == sch.BACKWARD]
        assert fwd == list(range(micro)) and bwd == list(range(micro))
        for m in range(micro):
            assert ops.index(sch.Op(sch.FORWARD, m)) < ops.index(sch.Op(sch.BACKWARD, m))


@pytest.mark.parametrize("stages", range(1, 10))
@pytest.mark.parametrize("micro", range(1, 10))
def test_a_stage_holds_at_most_stages_minus_its_index_micro_batches(stages, micro):
    for s in range(stages):
        alive = most = 0
        for op in sch.schedule(s, stages, micro):
            alive += (op.kind == sch.FORWARD) - (op.kind == sch.BACKWARD)
            most = max(most, alive)
        assert most == sch.in_flight(s, stages, micro) == min(stages - s, micro)


@pytest.mark.parametrize("stages", range(2, 10))
@pytest.mark.parametrize("micro", range(1, 10))
def test_neighbours_meet_their_messages_in_the_same_order(stages, micro):
    for s in range(stages - 1):
        down = sch.link_order(s, stages, micro, downstream=True)
        up = sch.link_order(s + 1, stages, micro, downstream=False)
        assert down == up
        assert sorted(down) == sorted([("act", m) for m in range(micro)]
                                      + [("grad", m) for m in range(micro)])


def test_a_message_is_received_before_its_step_runs_and_sent_after():
    ops = sch.schedule(1, 3, 4)
    for m in range(4):
        assert ops.index(sch.Op(sch.RECV_ACT, m)) < ops.index(sch.Op(sch.FORWARD, m)) \
            < ops.index(sch.Op(sch.SEND_ACT, m))
        assert ops.index(sch.Op(sch.RECV_GRAD, m)) < ops.index(sch.Op(sch.BACKWARD, m)) \
            < ops.index(sch.Op(sch.SEND_GRAD, m))


def test_the_ends_send_and_receive_only_toward_their_one_neighbour():
    first = {o.kind for o in sch.schedule(0, 3, 4)}
    last = {o.kind for o in sch.schedule(2, 3, 4)}
    assert first == {sch.FORWARD, sch.BACKWARD, sch.SEND_ACT, sch.RECV_GRAD}
    assert last == {sch.FORWARD, sch.BACKWARD, sch.RECV_ACT, sch.SEND_GRAD}
    assert {o.kind for o in sch.schedule(0, 1, 3)} == {sch.FORWARD, sch.BACKWARD}


def test_step_time_is_the_first_micro_batch_through_then_the_slowest_stage():
    # 3 stages of 1, 2 and 1 s, 4 micro-batches, 0.5 s a message:
    # 1 + 2 + 1 + 3 x 2 + 2 x 2 x 0.5
    assert sch.step_seconds([1.0, 2.0, 1.0], 4, 0.5) == 4 + 6 + 2
    assert sch.step_seconds([3.0], 5) == 15.0        # one stage: no bubble
    assert sch.bubble(4, 12) == pytest.approx(3 / 15)
    assert sch.bubble(1, 8) == 0


def test_no_schedule_for_a_stage_outside_the_pipeline():
    with pytest.raises(ValueError, match="stage 3 of 3"):
        sch.schedule(3, 3, 2)


@pytest.mark.parametrize("stages", range(2, 8))
@pytest.mark.parametrize("micro", range(1, 7))
def test_stages_below_the_first_that_trains_run_forwards_only_and_links_agree(stages, micro):
    for fb in range(stages):
        for s in range(stages - 1):
            down = sch.link_order(s, stages, micro, True, fb)
            assert down == sch.link_order(s + 1, stages, micro, False, fb)
            grads = [("grad", m) for m in range(micro)] if s + 1 > fb else []
            assert sorted(down) == sorted([("act", m) for m in range(micro)] + grads)
        for s in range(stages):
            kinds = {o.kind for o in sch.schedule(s, stages, micro, fb)}
            assert (sch.BACKWARD in kinds) == (s >= fb)
            assert (sch.SEND_GRAD in kinds) == (s > fb)
