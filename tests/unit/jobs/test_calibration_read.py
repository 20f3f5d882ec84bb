"""``calibration.json`` reaches ``mlxops plan`` through the node's ``calibration`` command:
the node reads the file the trainer's writer wrote, the controller reads the node's answer
line (here: on a local host, as over SSH)."""

from __future__ import annotations

import json
import re
import sys
from contextlib import redirect_stdout
from io import StringIO
from pathlib import Path

import pytest
import yaml

from mlxops.inventory import load_inventory
from mlxops.jobs.balance import recorded_calibration
from mlxops.jobs.record import HostRecord, JobRecord
from mlxops.jobs.spec import load_job
from mlxops.node import protocol
from mlxops.node.__main__ import main as node_main
from mlxops.node.protocol.calibration import Calibration, calibration_args
from mlxops.transport import Connector

#: What the trainer writes (trainer/train.py, ``_calibrate``), through the record's writer.
MEASURED = Calibration(step=4, world_size=2, hosts=["a", "b"],
                       samples_per_sec=[312.5, 98.25], batch_split=[6, 2], time=1700000000.5)


def ask(run_dir: Path):
    """The node's answer to the controller's argument list, read as the controller reads it."""
    args = calibration_args(str(run_dir))
    out = StringIO()
    with redirect_stdout(out):
        assert node_main(args) == 0
    return protocol.parse_answer(args[0], out.getvalue().strip())


def test_the_node_answers_with_the_record_the_trainer_wrote(tmp_path):
    (tmp_path / protocol.CALIBRATION).write_text(MEASURED.to_json())
    answer = ask(tmp_path)
    assert answer.calibration == MEASURED and answer.unreadable is None


def test_a_run_that_did_not_measure_has_no_record(tmp_path):
    answer = ask(tmp_path)
    assert answer.calibration is None and answer.unreadable is None


@pytest.mark.parametrize("text, why", [
    ("{", r"^calibration.json: not JSON"),
    (json.dumps({**MEASURED.to_dict(), "batch_split": None}),
     r"^calibration.json: Calibration.batch_split: want a list of int, got None$"),
    (json.dumps({k: v for k, v in MEASURED.to_dict().items() if k != "hosts"}),
     r"^calibration.json: Calibration: no 'hosts' in"),
])
def test_a_file_that_is_not_a_record_is_none_and_says_which_field(tmp_path, text, why):
    (tmp_path / protocol.CALIBRATION).write_text(text)
    answer = ask(tmp_path)
    assert answer.calibration is None
    assert answer.unreadable is not None
    assert re.search(why, answer.unreadable), answer.unreadable


@pytest.fixture
def local_job(tmp_path, monkeypatch):
    """A job ``j`` on two local hosts a and b, launched from here once (its record)."""
    monkeypatch.setenv("MLXOPS_HOME", str(tmp_path / "home"))
    roots = {h: tmp_path / h for h in ("a", "b")}
    inventory = {"all": {"vars": {"ansible_connection": "local",
                                  "mlxops_python": sys.executable},
                         "hosts": {h: {"mlxops_root": str(root)}
                                   for h, root in roots.items()}}}
    (tmp_path / "inv.yml").write_text(yaml.safe_dump(inventory))
    job = {"name": "j", "inventory": "inv.yml", "balance": "auto",
           "trainer": {"model": {"dims": 32, "layers": 1, "heads": 2, "seq_len": 16},
                       "train": {"steps": 10, "global_batch": 8}}}
    (tmp_path / "job.yml").write_text(yaml.safe_dump(job))
    JobRecord(name="j", job_file=str(tmp_path / "job.yml"), inventory=str(tmp_path / "inv.yml"),
              backend="ring", hosts=[HostRecord(h, str(r), sys.executable)
                                     for h, r in roots.items()], ranks=[]).save()
    for root in roots.values():
        (root / protocol.run_path("j")).mkdir(parents=True)
    hosts = list(load_inventory(tmp_path / "inv.yml").hosts.values())
    return load_job(tmp_path / "job.yml"), hosts, roots


def test_mlxops_plan_reads_the_first_hosts_record_through_the_node(local_job):
    spec, hosts, roots = local_job
    (roots["a"] / protocol.run_path("j") / protocol.CALIBRATION).write_text(MEASURED.to_json())
    with Connector() as connector:
        got, source = recorded_calibration(spec, hosts, connector)
    assert got == MEASURED
    assert source == "measured by job j at step 4 on a"


def test_mlxops_plan_shows_no_times_when_the_file_is_junk(local_job):
    spec, hosts, roots = local_job
    (roots["a"] / protocol.run_path("j") / protocol.CALIBRATION).write_text("{}\n")
    with Connector() as connector:
        assert recorded_calibration(spec, hosts, connector) == (None, "")
