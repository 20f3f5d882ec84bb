"""A job's balance: seen from the controller: the split, predicted times, who does not pay."""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest
import yaml
from rich.console import Console

from mlxops import console
from mlxops.cli.plan_balance import balance_notes, balance_table, shown
from mlxops.jobs.balance import plan_balance
from mlxops.jobs.spec import load_job, rank_weights
from mlxops.node.protocol.calibration import Calibration
from mlxops.trainer.balance import Balance, recorded_speeds


def spec_with(tmp_path, balance, global_batch=8, hosts=("studio", "air")):
    inventory = {"all": {"hosts": {h: {"ansible_host": f"10.0.0.{i + 1}"}
                                   for i, h in enumerate(hosts)}}}
    (tmp_path / "inv.yml").write_text(yaml.safe_dump(inventory))
    job = {"name": "tiny", "inventory": "inv.yml", "balance": balance,
           "trainer": {"model": {"dims": 32, "layers": 1, "heads": 2, "seq_len": 16},
                       "train": {"steps": 10, "global_batch": global_batch}}}
    (tmp_path / "job.yml").write_text(yaml.safe_dump(job))
    return load_job(tmp_path / "job.yml")


def hosts(*name_slots):
    return [SimpleNamespace(name=n, slots=s) for n, s in name_slots]


def calibration(**speeds):
    names = [h for h, v in speeds.items() for _ in v]
    measured = [float(x) for v in speeds.values() for x in v]
    return Calibration(step=4, world_size=len(names), hosts=names, samples_per_sec=measured,
                       batch_split=[1] * len(names), time=0.0)


@pytest.mark.parametrize("balance, global_batch, slots, measured", [
    ("equal", 8, (1, 1), None), ("equal", 9, (2, 1), None), ("equal", 7, (1, 1), None),
    ({"studio": 3, "air": 1}, 8, (2, 1), None), ("auto", 9, (1, 2), None),
    ("auto", 12, (1, 1), {"studio": [200.0], "air": [20.0]}),
    ("auto", 12, (1, 1), {"studio": [105.0], "air": [100.0]}),
    ({"studio": 1, "air": 2}, 5, (1, 1), {"studio": [200.0], "air": [20.0]}),
])
def test_the_plan_shows_the_split_the_trainer_takes(tmp_path, balance, global_batch, slots,
                                                   measured):
    spec = spec_with(tmp_path, balance, global_batch)
    the_hosts = hosts(("studio", slots[0]), ("air", slots[1]))
    plan = plan_balance(spec, the_hosts, calibration(**measured) if measured else None)
    rank_hosts = [h.name for h in the_hosts for _ in range(h.slots)]
    # the ranks' config, as mlxops writes it, through the trainer's own rule
    config = spec.workload.rank_config(rank_weights(spec, rank_hosts))
    cal = calibration(**measured) if measured else None
    speeds = recorded_speeds(rank_hosts, cal.hosts, cal.samples_per_sec) if cal else None
    try:
        trainer = Balance.of(config.train.balance).split(global_batch, len(rank_hosts), speeds)
    except ValueError:
        trainer = [0] * len(rank_hosts)  # refused: the plan shows no split
    assert [n for h in plan.hosts for n in h.sequences] == trainer


def test_host_weights_split_without_speeds(tmp_path):
    spec = spec_with(tmp_path, {"studio": 3, "air": 1})
    plan = plan_balance(spec, hosts(("studio", 1), ("air", 1)))
    assert plan.mode == "weights" and not plan.measured
    assert [(h.host, h.sequences, h.compute_ms) for h in plan.hosts] == [
        ("studio", [6], None), ("air", [2], None)]
    assert plan.step_ms is None and plan.not_paying == []


def test_auto_with_a_recorded_calibration_predicts_and_finds_the_node_that_does_not_pay(
        tmp_path):
    spec = spec_with(tmp_path, "auto")
    cal = calibration(studio=[200.0], air=[20.0])
    plan = plan_balance(spec, hosts(("studio", 1), ("air", 1)), cal, "measured by job tiny")
    assert [h.sequences for h in plan.hosts] == [[7], [1]]
    assert plan.step_ms == pytest.approx(50.0)      # the air's one sequence
    assert plan.equal_ms == pytest.approx(200.0)    # 4 sequences on the air
    assert plan.without == {"studio": pytest.approx(400.0), "air": pytest.approx(40.0)}
    assert plan.not_paying == ["air"]
    assert plan.measured == "measured by job tiny"


def test_auto_keeps_the_equal_split_when_the_speeds_are_close(tmp_path):
    spec = spec_with(tmp_path, "auto")
    plan = plan_balance(spec, hosts(("studio", 1), ("air", 1)),
                        calibration(studio=[105.0], air=[100.0]))
    assert [h.sequences for h in plan.hosts] == [[4], [4]]
    assert plan.not_paying == []


def test_a_hosts_ranks_share_it_and_a_calibration_missing_a_host_gives_no_times(tmp_path):
    spec = spec_with(tmp_path, {"studio": 2, "air": 1}, global_batch=12)
    plan = plan_balance(spec, hosts(("studio", 2), ("air", 1)), calibration(studio=[50, 50]))
    assert [h.sequences for h in plan.hosts] == [[4, 4], [4]]
    assert plan.step_ms is None and not plan.measured


def test_a_hosts_speeds_hold_while_its_rank_count_does(tmp_path):
    spec = spec_with(tmp_path, "auto", global_batch=12)
    cal = calibration(studio=[300.0, 100.0], air=[200.0])
    same = plan_balance(spec, hosts(("studio", 2), ("air", 1)), cal)
    assert [h.samples_per_sec for h in same.hosts] == [[300.0, 100.0], [200.0]]
    without_air = plan_balance(spec, hosts(("studio", 2),), cal)  # an --exclude
    assert [h.samples_per_sec for h in without_air.hosts] == [[300.0, 100.0]]
    fewer = plan_balance(spec, hosts(("studio", 1), ("air", 1)), cal)  # slots changed
    assert fewer.hosts[0].samples_per_sec is None and not fewer.measured


def test_equal_with_speeds_says_what_unequal_nodes_cost(tmp_path):
    spec = spec_with(tmp_path, "equal")
    plan = plan_balance(spec, hosts(("studio", 1), ("air", 1)),
                        calibration(studio=[200.0], air=[20.0]), "measured")
    assert [h.sequences for h in plan.hosts] == [[4], [4]]
    assert plan.step_ms == pytest.approx(200.0)
    assert plan.not_paying == ["air"]  # 8 on the studio alone: 40 ms
    assert shown(plan)
    assert not shown(plan_balance(spec, hosts(("studio", 1), ("air", 1))))


def test_the_balance_table_and_notes_read_in_80_columns(tmp_path):
    names = ("mac-studio-m2-ultra", "macbook-air-m2", "mini-rack-07")
    spec = spec_with(tmp_path, "auto", global_batch=48, hosts=names)
    cal = calibration(**{names[0]: [400.5, 401.0], names[1]: [12.5], names[2]: [150.0]})
    plan = plan_balance(spec, hosts((names[0], 2), (names[1], 1), (names[2], 1)), cal,
                        f"measured by job tiny at step 4 on {names[0]}")
    buf = io.StringIO()
    con = Console(file=buf, width=80, force_terminal=True, color_system=None)
    console.print_table(balance_table(plan), con)
    text = buf.getvalue()
    assert "…" not in text and all(len(line) <= 80 for line in text.splitlines())
    header = text.splitlines()[0]
    for h in ("host", "ranks", "seqs/step", "samples/s", "compute ms"):
        assert h in header
    assert f"{names[0]}" in text and "400.5,401.0" in text
    notes = balance_notes(plan)
    assert notes[0] == (f"balance: auto; samples/s measured by job tiny at step 4 on "
                        f"{names[0]}")
    assert notes[1].startswith("predicted compute ") and "equal split" in notes[1]
    assert notes[2].startswith(f"{names[1]} does not pay for itself: ")
