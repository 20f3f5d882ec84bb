"""train.balance: unequal slices of the same global batch, weighted by sample count."""

from __future__ import annotations

import json
import math
import shutil
import socket

import numpy as np
import pytest
from trainer_procs import losses, ok, run_trainer, write_config

from mlxops.node.calibration import read_calibration
from mlxops.node.protocol.calibration import Calibration
from mlxops.trainer import balance
from mlxops.trainer.config import ConfigError, check_world, load_config
from mlxops.trainer.data import Batches, SyntheticSource


def test_split_counts_minimises_the_slowest_rank():
    assert balance.split_counts(8, [1, 1]) == [4, 4]
    assert balance.split_counts(12, [1, 1, 1]) == [4, 4, 4]
    assert balance.split_counts(8, [3, 1]) == [6, 2]
    assert balance.split_counts(7, [1, 1]) == [4, 3]       # ties go to the lower rank
    assert balance.split_counts(8, [100, 100, 5]) == [4, 3, 1]  # at least one each
    assert sum(balance.split_counts(1000, [1.7, 0.3, 2.9])) == 1000
    with pytest.raises(ValueError, match="at least one each"):
        balance.split_counts(2, [1, 1, 1])


def test_the_equal_split_has_weight_exactly_one():
    assert [balance.scale([4, 4, 4], r) for r in range(3)] == [1.0, 1.0, 1.0]
    assert [balance.scale([6, 2], r) for r in range(2)] == [1.5, 0.5]
    assert balance.step_seconds([6, 2], [3.0, 1.0]) == 2.0


def test_one_split_rule_for_every_mode():
    assert balance.Balance.of("equal").split(12, 3) == [4, 4, 4]
    with pytest.raises(ValueError, match="equally"):
        balance.Balance.of("equal").split(7, 2)
    assert balance.Balance.of([3, 1]).split(8, 2) == [6, 2]
    with pytest.raises(ValueError, match="2 weights for 3 ranks"):
        balance.Balance.of([3, 1]).split(8, 3)
    auto = balance.Balance.of("auto")
    assert auto.measures and not balance.Balance.of("equal").measures
    assert auto.split(7, 2) == [4, 3]                     # before it measured: near-equal
    assert auto.split(8, 2, [300.0, 100.0]) == [6, 2]      # by the speeds
    assert auto.split(8, 2, [105.0, 100.0]) == [4, 4]      # a gain under MIN_GAIN: kept
    with pytest.raises(ValueError, match="fast"):
        balance.Balance.of("fast")


def test_the_calibration_record_round_trips_and_names_what_is_missing():
    record = Calibration(step=4, world_size=2, hosts=["a", "b"],
                         samples_per_sec=[300.0, 100.0], batch_split=[6, 2], time=1700000000.5)
    assert Calibration.from_json(record.to_json()) == record

    def speeds_for(rank_hosts):
        return balance.recorded_speeds(rank_hosts, record.hosts, record.samples_per_sec)

    assert speeds_for(["b"]) == [100.0]  # without a (an --exclude): b's own speed
    assert speeds_for(["a", "a"]) is None  # a measured with one rank, now two
    assert speeds_for(["a", "b"]) == [300.0, 100.0]
    data = json.loads(record.to_json())
    for name in data:
        partial = {k: v for k, v in data.items() if k != name}
        with pytest.raises(ValueError,
                           match=rf"^x/calibration.json: Calibration: no '{name}' in"):
            Calibration.from_json(json.dumps(partial), "x/calibration.json")
    with pytest.raises(ValueError, match=r"Calibration.hosts\[1\]: want str, got 2"):
        Calibration.from_json(json.dumps({**data, "hosts": ["a", 2]}))
    with pytest.raises(ValueError, match="not JSON"):
        Calibration.from_json("{")


def test_config_rules():
    cfg = load_config({"train": {"global_batch": 7, "balance": [2, 1.5]}})
    assert cfg.train.balance == [2.0, 1.5]
    check_world(cfg, 2)  # 7 over 2 ranks: fine when the split is not equal
    with pytest.raises(ConfigError, match=r"train\.balance: 2 weights for 3 ranks"):
        check_world(cfg, 3)
    with pytest.raises(ConfigError, match="not divisible"):
        check_world(load_config({"train": {"global_batch": 7}}), 2)
    check_world(load_config({"train": {"global_batch": 7, "balance": "auto"}}), 2)
    with pytest.raises(ConfigError, match="smaller than the world size 8"):
        check_world(load_config({"train": {"global_batch": 7, "balance": "auto"}}), 8)
    for bad in ("fast", [], [1, 0], [1, -2], [True], [1, "2"]):
        with pytest.raises(ConfigError, match=r"^trainer: train\.balance: must be equal, auto "
                                              r"or a list of positive numbers"):
            load_config({"train": {"balance": bad}})
    assert load_config({}, ["train.balance=[3,1]"]).train.balance == [3.0, 1.0]
    assert load_config({}, ["train.balance=auto"]).train.balance == "auto"


def test_unequal_slices_cover_the_global_batch_in_order():
    source = SyntheticSource(1, 64, 8)
    counts = [5, 1, 2]
    got = [x for r in range(3)
           for x, _ in Batches(source, 8, r, 3, counts).micro_batches(4, 2)]
    assert np.array_equal(np.concatenate(got), source.samples(4 * 8, 8)[:, :-1])


@pytest.fixture(scope="module")
def equal(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("balance")
    ok(run_trainer(write_config(tmp, tmp / "equal", train={"steps": 20}), ranks=2))
    return tmp, losses(tmp / "equal")


def _close(got: dict, ref: dict, steps) -> None:
    for s in steps:
        assert math.isclose(got[s], ref[s], rel_tol=1e-4), (s, got[s], ref[s])


def test_weighted_split_trains_as_the_equal_split(equal):
    tmp, ref = equal
    out = tmp / "weighted"
    ok(run_trainer(write_config(tmp, out, train={"steps": 20, "balance": [3, 1]}), ranks=2))
    got = losses(out)
    assert sorted(got) == list(range(1, 21))
    _close(got, ref, range(1, 21))
    assert any(got[s] != ref[s] for s in got)  # another summation order, same update
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert {tuple(r["batch_split"]) for r in recs} == {(6, 2)}
    assert recs[-1]["micro_batch"] * recs[-1]["accumulation"] == 6  # rank 0's share


def test_a_weighted_run_resumes_equal_on_another_world_size(equal):
    tmp, ref = equal
    half = tmp / "weighted-half"
    ok(run_trainer(write_config(tmp, half, train={"steps": 20, "stop_at": 10,
                                                  "checkpoint_every": 10,
                                                  "balance": [1, 3]}), ranks=2))
    for world, split in ((1, "equal"), (2, [5, 1])):
        out = tmp / f"weighted-resumed-{world}"
        shutil.copytree(half, out)
        ok(run_trainer(write_config(tmp, out, train={"steps": 20, "balance": split}),
                       "--resume", ranks=world))
        _close(losses(out), ref, range(1, 21))


def test_auto_measures_the_ranks_and_gives_the_slow_one_less(equal):
    tmp, ref = equal
    out = tmp / "auto"
    cfg = write_config(tmp, out, train={"steps": 20, "checkpoint_every": 10,
                                        "balance": "auto"})
    slow = {"MLXOPS_TRAINER_FAKE_SLOW": "1:0.03"}  # rank 1: +30 ms per sequence
    proc = ok(run_trainer(cfg, ranks=2, env=slow))
    assert "balance: auto: samples/s per rank" in proc.stdout
    calibration = read_calibration(out).calibration  # as the node answers `mlxops plan`
    assert calibration is not None and calibration.step == 4 and calibration.world_size == 2
    fast, slow_speed = calibration.samples_per_sec
    # In order, by no set margin: +30 ms a sequence was over 2x at the step's speed on a
    # quiet machine, 1.28x with the suite and another engineer's benchmarks beside it.
    assert fast > slow_speed
    split = calibration.batch_split
    assert split[0] > split[1] >= 1 and sum(split) == 8
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [tuple(r["batch_split"]) for r in recs] == [(4, 4)] * 4 + [tuple(split)] * 16
    _close(losses(out), ref, range(1, 21))

    # A resume takes the speeds the checkpoint recorded instead of measuring again.
    shutil.rmtree(out / "ckpt" / "step-00000020")
    (out / "ckpt" / "latest").write_text("step-00000010\n")
    again = ok(run_trainer(cfg, "--resume", ranks=2))
    assert "the speeds measured before" in again.stdout and f"split {split}" in again.stdout
    assert "balance: auto: samples/s per rank" not in again.stdout  # no new calibration
    _close(losses(out), ref, range(1, 21))


def _recorded_as(out, hosts: list[str], speeds: list[float]) -> None:
    """Make the step-10 checkpoint say its calibration measured ranks on ``hosts``."""
    state = out / "ckpt" / "step-00000010" / "state.json"
    doc = json.loads(state.read_text())
    doc["balance_hosts"], doc["balance_speeds"] = hosts, speeds
    state.write_text(json.dumps(doc))
    shutil.rmtree(out / "ckpt" / "step-00000020")
    (out / "ckpt" / "latest").write_text("step-00000010\n")


def test_auto_keeps_a_hosts_speeds_across_world_sizes_while_its_rank_count_holds(equal):
    tmp, ref = equal
    here = socket.gethostname()  # every rank's host: they all run on this machine
    cfg_of = {}
    for name in ("excluded", "reshaped"):
        out = tmp / f"auto-{name}"
        cfg_of[name] = write_config(tmp, out, train={"steps": 20, "checkpoint_every": 10,
                                                     "balance": "auto"})
        ok(run_trainer(cfg_of[name], ranks=2))

    # Measured on 3 ranks, one of them on a host now left out (mlxops resume --exclude):
    # the two ranks of this host keep their speeds, so the split is theirs at once.
    out = tmp / "auto-excluded"
    _recorded_as(out, ["gone", here, here], [500.0, 300.0, 100.0])
    again = ok(run_trainer(cfg_of["excluded"], "--resume", ranks=2))
    assert "the speeds measured before (samples/s per rank [300.0, 100.0]): split [6, 2]" \
        in again.stdout
    assert "balance: auto: samples/s per rank" not in again.stdout
    _close(losses(out), ref, range(1, 21))

    # Measured with three ranks on this host: two ranks on it now run at other speeds.
    out = tmp / "auto-reshaped"
    _recorded_as(out, [here] * 3, [300.0, 200.0, 100.0])
    again = ok(run_trainer(cfg_of["reshaped"], "--resume", ranks=2))
    assert "do not fit the ranks now" in again.stdout and "measuring again" in again.stdout
    assert Calibration.from_json((out / "calibration.json").read_text()).step == 14
    _close(losses(out), ref, range(1, 21))
