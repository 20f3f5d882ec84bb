"""Each kind of work over the one protocol (mlxops/jobs/workloads/): parsed from a job
file, the contents it places, its rank plan on a node, and its copy in the record read
back as the same type. And the registry: a job file gives exactly one kind."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from mlxops.errors import UserError
from mlxops.jobs.placement import NodePaths, place_ranks
from mlxops.jobs.record import JobRecord, launched_job
from mlxops.jobs.spec import load_job
from mlxops.jobs.workloads import KINDS, NodePlacement, Workload
from mlxops.jobs.workloads.command import CommandWorkload
from mlxops.jobs.workloads.finetune import FinetuneWorkload
from mlxops.jobs.workloads.serve import ServeWorkload
from mlxops.jobs.workloads.trainer import TrainerWorkload
from mlxops.node import protocol

INVENTORY = {"all": {"hosts": {"a": {"ansible_host": "10.0.0.1"},
                               "b": {"ansible_host": "10.0.0.2"}}}}
TRAINER = {"model": {"dims": 32, "layers": 1, "heads": 2, "seq_len": 16},
           "train": {"steps": 10, "global_batch": 4}}
ROOT = "/home/u/.mlxops"


def write(tmp_path: Path, **job) -> Path:
    (tmp_path / "inv.yml").write_text(yaml.safe_dump(INVENTORY))
    path = tmp_path / "job.yml"
    path.write_text(yaml.safe_dump({"name": "w", "inventory": "inv.yml", **job}))
    return path


def finetune_section(tmp_path: Path, layers: int | None = None, **method) -> dict:
    model, data = tmp_path / "models" / "tiny", tmp_path / "chat"
    model.mkdir(parents=True, exist_ok=True)
    data.mkdir(exist_ok=True)
    config = {} if layers is None else {"num_hidden_layers": layers}
    (model / "config.json").write_text(json.dumps(config))
    (data / "train.jsonl").write_text("")
    (data / "valid.jsonl").write_text("")
    section = {"model": {"path": "models/tiny"}, "data": {"path": "chat"},
               "train": {"steps": 20, "global_batch": 4}}
    if method:
        section["method"] = method
    return section


def node(spec, host: str = "a", resume: bool = False) -> NodePlacement:
    hosts = load_job_hosts(spec)
    ranks = place_ranks(hosts, spec.base_port,
                        one_per_host=spec.workload.one_rank_per_host)
    return NodePlacement(host=host, python="/py", paths=NodePaths(ROOT, spec.name),
                         ranks=ranks, balance="equal", resume=resume)


def load_job_hosts(spec):
    from mlxops.inventory import load_inventory

    return load_inventory(spec.inventory).select(spec.hosts)


def round_trip(spec) -> Workload:
    """The workload as a record keeps it on disk, read back."""
    record = JobRecord(name=spec.name, job_file=str(spec.path), inventory=str(spec.inventory),
                       backend=spec.backend, hosts=[], ranks=[], job=launched_job(spec))
    on_disk = json.loads(json.dumps(record.to_dict()))
    assert on_disk["job"][spec.workload.kind] == spec.workload.to_record()
    again = JobRecord.from_dict(on_disk)
    assert again.job_spec() == spec
    return again.workload


def test_the_registry_has_one_line_per_kind_and_each_kind_its_key():
    assert list(KINDS) == ["trainer", "finetune", "serve", "command"]
    assert all(cls.kind == key and issubclass(cls, Workload) for key, cls in KINDS.items())


def test_a_job_file_gives_exactly_one_kind(tmp_path):
    with pytest.raises(UserError, match=r"job\.yml: trainer: give exactly one of 'trainer:' "
                                        r"\(the bundled trainer\), 'finetune:' .* or "
                                        r"'command:' \(your own program\)$"):
        load_job(write(tmp_path, trainer=TRAINER, command="python x.py"))
    with pytest.raises(UserError, match="give exactly one of"):
        load_job(write(tmp_path))


def test_the_trainer_kind(tmp_path):
    spec = load_job(write(tmp_path, trainer=TRAINER))
    w = spec.workload
    assert isinstance(w, TrainerWorkload) and w.config.train.steps == 10
    assert (w.splits_batch, w.one_rank_per_host, w.heartbeats, w.exports) == (
        True, False, True, True)
    assert w.contents() == [] and w.total_steps == 10 and w.global_batch == 4
    plan = w.rank_plan(node(spec, resume=True))
    config = json.loads(plan.files[protocol.TRAINER_CONFIG])
    assert config["out"] == f"{ROOT}/runs/w" and config["train"]["balance"] == "equal"
    assert plan.argv == {0: ["/py", "-m", "mlxops.trainer", "--config",
                             f"{ROOT}/runs/w/{protocol.TRAINER_CONFIG}", "--resume"]}
    assert plan.cwd == f"{ROOT}/runs/w" and plan.prepare == []
    assert round_trip(spec) == w


def test_the_finetune_kind(tmp_path):
    spec = load_job(write(tmp_path, finetune=finetune_section(tmp_path)))
    w = spec.workload
    assert isinstance(w, FinetuneWorkload) and w.needs_mlx_lm and w.adapters
    assert [c.local for c in w.contents()] == [tmp_path / "models" / "tiny", tmp_path / "chat"]
    plan = w.rank_plan(node(spec))
    config = json.loads(plan.files[protocol.FINETUNE_CONFIG])
    # The node's copies, computed by placement; the job's own paths stay the controller's.
    assert config["model"]["path"].startswith(f"{ROOT}/data/tiny-")
    assert config["data"]["path"].startswith(f"{ROOT}/data/chat-")
    assert w.config.model.path == str(tmp_path / "models" / "tiny")
    assert plan.argv[0][:3] == ["/py", "-m", "mlxops.finetune"] and "--resume" not in plan.argv[0]
    assert round_trip(spec) == w


def test_the_serve_kind(tmp_path):
    spec = load_job(write(tmp_path, serve={"model": "/models/tiny", "port": 9000,
                                           "parallel": "pipeline"}))
    w = spec.workload
    assert isinstance(w, ServeWorkload) and w.one_rank_per_host and not w.heartbeats
    assert w.probed and w.listens() == ("127.0.0.1", 9000) and w.contents() == []
    placed = node(spec, host="b")
    plan = w.rank_plan(placed)
    assert list(plan.argv) == [1]       # one rank per host: b's is rank 1
    assert plan.argv[1][:4] == ["/py", "-m", "mlx_lm", "server"] and "--pipeline" in plan.argv[1]
    assert plan.files == {} and plan.prepare  # the Hugging Face cache made first
    # Its own port, asked free on rank 0's host where it will listen (readiness's rules).
    assert w.binds() == ("127.0.0.1", 9000)
    assert round_trip(spec) == w


def test_the_command_kind(tmp_path):
    (tmp_path / "src").mkdir()
    spec = load_job(write(tmp_path, command="python train.py --lr '0.1'", workdir="src"))
    w = spec.workload
    assert isinstance(w, CommandWorkload) and w.argv == ("python", "train.py", "--lr", "0.1")
    assert not (w.splits_batch or w.exports or w.adapters) and w.planner(spec.path) is None
    placed = dataclasses.replace(node(spec), workdir=True)
    plan = w.rank_plan(placed)
    assert plan.argv == {0: ["/py", "train.py", "--lr", "0.1"]}   # the node's python
    assert plan.cwd == placed.paths.workdir() and plan.files == {}
    assert round_trip(spec) == w


def test_a_record_without_a_workload_or_with_two_is_refused(tmp_path):
    spec = load_job(write(tmp_path, trainer=TRAINER))
    doc = json.loads(json.dumps(JobRecord(
        name="w", job_file=str(spec.path), inventory=str(spec.inventory), backend="ring",
        hosts=[], ranks=[], job=launched_job(spec)).to_dict()))
    doc["job"]["command"] = ["python", "x.py"]
    with pytest.raises(ValueError, match="more than one of trainer, command"):
        JobRecord.from_dict(doc)
    del doc["job"]["command"], doc["job"]["trainer"]
    from mlxops.errors import MlxopsError
    with pytest.raises(MlxopsError, match="keeps no workload"):
        JobRecord.from_dict(doc).job_spec()


def test_data_and_workdir_go_with_the_kinds_that_take_them(tmp_path):
    (tmp_path / "src").mkdir()
    with pytest.raises(UserError, match=r"job\.yml: workdir: goes with 'command:'"):
        load_job(write(tmp_path, trainer=TRAINER, workdir="src"))
    with pytest.raises(UserError, match=r"job\.yml: data: goes with 'trainer:' .*a server "
                                        "reads its own data"):
        load_job(write(tmp_path, serve={"model": "/m"}, data="corpus"))



def test_no_code_outside_the_workloads_tests_which_kind_a_job_is():
    """No ``spec.serve``-style test of a job's kind, and no ``.get("serve")``-style read of
    the record's job mapping, outside ``mlxops/jobs/workloads/`` (the monitor's own job
    document, which names the kind's section, is not the record)."""
    import re

    root = Path(__file__).resolve().parents[3]
    kind = "(trainer|finetune|serve|command)"
    tests = re.compile(rf"\b(spec|job|record|workload)\.{kind}\b"
                       rf"|\bjob\b[^\n]*\.get\(\"{kind}\"\)|\bjob\[\"{kind}\"\]")
    found = []
    for path in sorted((root / "mlxops").rglob("*.py")):
        name = path.relative_to(root).as_posix()
        if not name.startswith("mlxops/jobs/workloads/"):
            found += [f"{name}:{n}: {line.strip()}"
                      for n, line in enumerate(path.read_text().splitlines(), 1)
                      if tests.search(line)]
    assert found == []
