"""``trainer.stages`` on a job (mlxops/jobs/workloads/trainer.py, mlxops/jobs/stagesplit.py):
parsed and checked at load, one rank per host, the split by each node's budget from its
facts (cached as ``mlxops provision`` caches them; the sizes are illustrative), what the
ranks are given, and ``mlxops plan``'s stage table.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import yaml

from mlxops.errors import UserError
from mlxops.hostfacts import HostFacts
from mlxops.jobs.spec import load_job
from mlxops.jobs.stagesplit import split_spec, stage_split
from mlxops.tasks.facts import save_facts

MODEL = {"dims": 256, "layers": 12, "heads": 4, "vocab_size": 4096, "seq_len": 256,
         "tie_embeddings": False}
GB = 2**30


def job(tmp_path, stages, hosts=("a", "b", "c"), **top) -> object:
    (tmp_path / "inv.yml").write_text(yaml.safe_dump({"all": {"hosts": {
        h: {"ansible_host": f"10.0.0.{i + 1}", "mlxops_slots": 2}
        for i, h in enumerate(hosts)}}}))
    section = {"model": MODEL, "train": {"global_batch": 8, "micro_batch": 2, "steps": 5}}
    if stages is not None:
        section["stages"] = stages
    (tmp_path / "job.yml").write_text(yaml.safe_dump({
        "name": "pipe", "inventory": "inv.yml", "trainer": section, **top}))
    return tmp_path / "job.yml"


def facts(tmp_path, monkeypatch, sizes: dict[str, float]) -> dict[str, HostFacts]:
    monkeypatch.setenv("MLXOPS_HOME", str(tmp_path / "home"))
    out = {}
    for host, gb in sizes.items():
        out[host] = replace(HostFacts.unknown(), memory_bytes=int(gb * GB), system="Linux")
        save_facts(host, out[host])
    return out


def hosts_of(spec):
    from mlxops.jobs.selection import select_hosts

    return select_hosts(spec)


def refused(path) -> str:
    with pytest.raises(UserError) as e:
        load_job(path)
    return str(e.value)


def test_a_split_that_is_not_the_models_layers_is_refused_naming_file_and_key(tmp_path):
    message = refused(job(tmp_path, [4, 4, 3]))
    assert "job.yml: trainer.stages: [4, 4, 3] sums to 11 layers; the model has 12 " \
           "(trainer.model.layers)" in message
    assert "trainer.stages: must be auto or a list" in refused(job(tmp_path, "even"))
    assert "trainer.train.stages: is set by mlxops" in refused(_train_stages(tmp_path))


def _train_stages(tmp_path):
    path = job(tmp_path, None)
    data = yaml.safe_load(path.read_text())
    data["trainer"]["train"]["stages"] = [6, 6]
    path.write_text(yaml.safe_dump(data))
    return path


def test_what_stages_cannot_do_yet_is_refused_at_load(tmp_path):
    path = job(tmp_path, "auto")
    data = yaml.safe_load(path.read_text())
    data["trainer"]["train"]["eval_every"] = 2
    path.write_text(yaml.safe_dump(data))
    assert "trainer.train.eval_every: validation across pipeline stages" in refused(path)


def test_one_rank_per_host_and_a_stage_per_host(tmp_path):
    spec = load_job(job(tmp_path, [4, 4, 4]))
    assert spec.workload.one_rank_per_host
    assert [h.name for h in hosts_of(spec)] == ["a", "b", "c"]   # slots 2 each: one rank
    with pytest.raises(UserError) as e:
        hosts_of(load_job(job(tmp_path, [6, 6])))
    assert "trainer.stages: [6, 6] gives 2 hosts layers; the hosts 'all' are 3" in str(e.value)
    with pytest.raises(UserError) as e:
        hosts_of(load_job(job(tmp_path, "auto", balance="auto")))
    assert "job.yml: balance: splits the batch" in str(e.value)


def test_auto_splits_unequal_nodes_by_memory_and_the_ranks_get_the_split(tmp_path,
                                                                         monkeypatch):
    node = facts(tmp_path, monkeypatch, {"a": 0.4, "b": 0.2, "c": 0.4})
    spec = load_job(job(tmp_path, "auto"))
    found = stage_split(spec, hosts_of(spec), node)
    assert sum(found.layers) == 12 and found.layers[1] < found.layers[2]
    assert all(p.fits for p in found.plans)
    split = split_spec(spec, hosts_of(spec), node)
    assert split.workload.config.train.stages == found.layers
    # What the record keeps: the split and that it was auto (a resume --exclude splits again).
    record = split.workload.to_record()
    assert record["stages"] == "auto" and record["train"]["stages"] == found.layers
    back = type(split.workload).from_record(json.loads(json.dumps(record)))
    assert back == split.workload
    seconds, bubble = found.step
    assert seconds is None and 0 < bubble < 1


def test_a_model_no_split_fits_is_refused_with_each_stages_numbers(tmp_path, monkeypatch):
    node = facts(tmp_path, monkeypatch, {"a": 0.05, "b": 0.05, "c": 0.05})
    spec = load_job(job(tmp_path, "auto"))
    with pytest.raises(UserError) as e:
        stage_split(spec, hosts_of(spec), node)
    message = str(e.value)
    assert "job.yml: trainer.stages: the model does not fit on 3 hosts even split by " \
           "memory: a: layers 0-" in message
    assert " of 0.04 GiB" in message


def test_an_explicit_split_a_node_cannot_hold_is_refused(tmp_path, monkeypatch):
    node = facts(tmp_path, monkeypatch, {"a": 0.4, "b": 0.1, "c": 0.4})
    spec = load_job(job(tmp_path, [2, 8, 2]))
    with pytest.raises(UserError) as e:
        stage_split(spec, hosts_of(spec), node)
    assert "trainer.stages: the split [2, 8, 2] does not fit: a: layers 0-1" in str(e.value)


def test_mlxops_plan_shows_each_stage_against_its_budget(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from mlxops.cli import cli as main

    facts(tmp_path, monkeypatch, {"a": 0.4, "b": 0.2, "c": 0.4})
    path = job(tmp_path, "auto")
    result = CliRunner().invoke(main, ["plan", str(path), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    stages = doc["stages"]
    assert sum(stages["layers"]) == 12 and [s["host"] for s in stages["stages"]] == \
        ["a", "b", "c"]
    assert all(s["peak_bytes"] <= s["budget_bytes"] for s in stages["stages"])
    assert stages["step_seconds"] is None and 0 < stages["bubble"] < 1
    text = CliRunner().invoke(main, ["plan", str(path)])
    assert text.exit_code == 0, text.output
    assert "pipeline bubble" in text.output and "stages: layers" in text.output


# --- finetune.stages: the same over an mlx-lm model's blocks (its config.json) ---------------


def ft_job(tmp_path, stages, *, eval_every=0, in_train=False) -> object:
    from model_files import write_model

    if not (tmp_path / "model").exists():
        write_model(tmp_path / "model", layers=6)
        (tmp_path / "data").mkdir()
        (tmp_path / "data" / "train.jsonl").write_text('{"text": "a"}\n')
    (tmp_path / "inv.yml").write_text(yaml.safe_dump({"all": {"hosts": {
        h: {"ansible_host": f"10.0.0.{i + 1}"} for i, h in enumerate("abc")}}}))
    train = {"global_batch": 4, "micro_batch": 2, "max_seq_len": 64, "eval_every": eval_every}
    if in_train:
        train["stages"] = [2, 2, 2]
    section = {"model": {"path": "model"}, "data": {"path": "data"}, "train": train,
               "method": {"num_layers": -1}, "stages": stages}
    (tmp_path / "job.yml").write_text(yaml.safe_dump({
        "name": "ftpipe", "inventory": "inv.yml", "finetune": section}))
    return tmp_path / "job.yml"


def test_finetune_stages_are_checked_at_load_naming_file_and_key(tmp_path):
    message = refused(ft_job(tmp_path, [2, 2]))
    assert f"job.yml: finetune.stages: [2, 2] sums to 4 layers; the model has 6 " \
           f"(num_hidden_layers in {tmp_path / 'model'}/config.json)" in message
    assert "finetune.stages: must be auto or a list" in refused(ft_job(tmp_path, [2, 0, 4]))
    assert "finetune.train.stages: is set by mlxops" in refused(ft_job(tmp_path, "auto",
                                                                        in_train=True))
    assert "job.yml: finetune.train.eval_every: validation across pipeline stages" in \
        refused(ft_job(tmp_path, "auto", eval_every=100))
    with pytest.raises(UserError) as e:
        hosts_of(load_job(ft_job(tmp_path, [3, 3])))
    assert "finetune.stages: [3, 3] gives 2 hosts blocks; the hosts 'all' are 3" in str(e.value)


def test_finetune_stages_auto_splits_unequal_nodes_by_fine_tunings_plan(tmp_path,
                                                                         monkeypatch):
    node = facts(tmp_path, monkeypatch, {"a": 0.4, "b": 0.2, "c": 0.4})
    spec = load_job(ft_job(tmp_path, "auto"))
    assert spec.workload.one_rank_per_host and spec.workload.stages is None
    assert spec.workload.collectives(3) == ("send_recv",)
    found = stage_split(spec, hosts_of(spec), node)
    assert sum(found.layers) == 6 and found.layers[1] < found.layers[0]
    split = split_spec(spec, hosts_of(spec), node)
    assert split.workload.stages == found.layers
    # Each stage's checkpoint is its node's alone: a resume on another split (--exclude)
    # brings the parts it needs first, by these layers (jobs/ckptmove.py).
    assert split.workload.spreads_checkpoints()
    assert split.workload.stage_layers() == found.layers
    record = split.workload.to_record()
    assert record["stages"] == "auto" and record["train"]["stages"] == found.layers
    assert type(split.workload).from_record(json.loads(json.dumps(record))) == split.workload
    from click.testing import CliRunner

    from mlxops.cli import cli as main

    result = CliRunner().invoke(main, ["plan", str(tmp_path / "job.yml"), "--json"])
    assert result.exit_code == 0, result.output
    planned = json.loads(result.output)["stages"]
    assert planned["layers"] == found.layers
    assert all(s["peak_bytes"] <= s["budget_bytes"] for s in planned["stages"])
