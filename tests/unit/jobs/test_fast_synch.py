"""MLX_METAL_FAST_SYNCH as a per-job decision (mlxops/jobs/fastsynch.py): the job's
``fast_synch`` over its ``env`` over the inventory, off by default; kept in the record and
said with its risk by ``status`` and the report."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_job_spec import GOOD, with_, write

from mlxops.errors import UserError
from mlxops.inventory import Host
from mlxops.jobs.fastsynch import RISK, fast_synch_on
from mlxops.jobs.placement import Rank
from mlxops.jobs.record import HostRecord, JobRecord
from mlxops.jobs.spec import load_job
from mlxops.jobs.status import JobStatus
from mlxops.monitor.data import MirrorReader
from mlxops.monitor.report import html_report, report_document

DATA = Path(__file__).parents[1] / "data" / "monitor"


def test_the_job_decides_for_its_ranks(tmp_path):
    assert load_job(write(tmp_path, with_(fast_synch=True))).env["MLX_METAL_FAST_SYNCH"] == "1"
    off = load_job(write(tmp_path, {**GOOD, "fast_synch": False}))
    assert off.env["MLX_METAL_FAST_SYNCH"] == "0" and off.fast_synch is False
    unset = load_job(write(tmp_path, GOOD))
    assert unset.fast_synch is None and "MLX_METAL_FAST_SYNCH" not in unset.env


@pytest.mark.parametrize("job, says", [
    ({**GOOD, "fast_synch": "yes"}, "must be true or false"),
    ({**GOOD, "fast_synch": True, "env": {"MLX_METAL_FAST_SYNCH": 0}}, "disagrees"),
])
def test_bad_fast_synch_is_one_line_naming_the_key(tmp_path, job, says):
    with pytest.raises(UserError) as caught:
        load_job(write(tmp_path, job))
    assert "fast_synch" in str(caught.value) and says in str(caught.value)


def test_on_only_where_the_job_or_every_host_says_so():
    on = [Host("a", {"mlxops_metal_fast_synch": 1}), Host("b", {"mlxops_metal_fast_synch": 1})]
    default = [Host("a", {}), Host("b", {})]
    assert fast_synch_on({}, default) is False            # MLX's docs: off
    assert fast_synch_on({}, on) is True                  # the inventory's decision
    assert fast_synch_on({"MLX_METAL_FAST_SYNCH": "0"}, on) is False   # the job's wins
    assert fast_synch_on({"MLX_METAL_FAST_SYNCH": "1"}, default) is True


def test_the_record_keeps_it_and_status_and_the_report_say_it(tmp_path, monkeypatch):
    rec = JobRecord(name="j", job_file="j.yml", inventory="inv.yml", backend="ring",
                    hosts=[HostRecord("a", "/r", "/py")], ranks=[Rank(0, "a", "1.1.1.1", 1, 0)],
                    fast_synch=True)
    data = rec.to_dict()
    assert JobRecord.from_dict(data).fast_synch is True
    del data["fast_synch"]                               # a record written before the field
    assert JobRecord.from_dict(data).fast_synch is False
    assert JobStatus("j", "running", [], fast_synch=True).to_dict()["fast_synch"] is True
    assert "fast_synch" not in JobStatus("j", "running", []).to_dict()
    # the report of a recorded job (tests/unit/data/monitor), once with the field set
    home = tmp_path / "home"
    shutil.copytree(DATA / "running", home / "jobs")
    monkeypatch.setenv("MLXOPS_HOME", str(home))
    assert "MLX_METAL_FAST_SYNCH on" not in html_report(
        report_document(MirrorReader("tiny-lm").read()))
    recorded = home / "jobs" / "tiny-lm" / "record.json"
    recorded.write_text(json.dumps({**json.loads(recorded.read_text()), "fast_synch": True}))
    doc = report_document(MirrorReader("tiny-lm").read())
    assert doc.extras["fast_synch"] == RISK
    page = html_report(doc)
    assert "MLX_METAL_FAST_SYNCH on" in page and "wedge the GPU" in page


def test_status_prints_the_risk(capsys):
    from mlxops import console
    from mlxops.cli.watch import print_status

    with console.out.capture() as captured:
        print_status(JobStatus("j", "running", [], fast_synch=True))
    assert "MLX_METAL_FAST_SYNCH on" in captured.get()


def test_bench_says_fast_synch_does_not_apply_on_linux(tmp_path, monkeypatch):
    from mlxops.bench.run import fast_synch_findings
    from mlxops.hostfacts import HostFacts
    from mlxops.tasks.facts import save_facts

    monkeypatch.setenv("MLXOPS_HOME", str(tmp_path))
    hosts = [Host("n1", {}), Host("n2", {})]
    assert fast_synch_findings(hosts) == []               # never provisioned: unknown
    for name, system in (("n1", "Linux"), ("n2", "Linux")):
        facts = HostFacts.unknown()
        facts.system = system
        save_facts(name, facts)
    (finding,) = fast_synch_findings(hosts)
    assert finding["kind"] == "fast_synch" and "does not apply" in finding["message"]
    facts.system = "Darwin"
    save_facts("n2", facts)
    assert "not measured" in fast_synch_findings(hosts)[0]["message"]
