"""``train.shard_optimizer: auto`` on a job (mlxops/jobs/sharding.py): decided over the
job's hosts from each node's budget in its facts (cached as ``mlxops provision`` caches
them; the sizes are illustrative, chosen around the plan of the model below), what the
ranks are given and the record keeps, the refusal of a job that fits neither way, and
``mlxops plan``'s lines and JSON.

The model's rank plans on 3 ranks (float32, trainer/plan.py): 764 MB with the optimizer
state whole, 648 MB sharded; a node of 0.88 GB has a budget of 721 MB (80%).
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import yaml

from mlxops.errors import UserError
from mlxops.hostfacts import HostFacts
from mlxops.jobs.selection import select_hosts
from mlxops.jobs.sharding import shard_spec
from mlxops.jobs.spec import load_job
from mlxops.node.protocol.collectives import ALL_GATHER
from mlxops.tasks.facts import save_facts

MODEL = {"dims": 512, "layers": 2, "heads": 4, "vocab_size": 32000, "seq_len": 16}
GB = 2**30
SMALL, BIG = 0.88, 8.0


def job(tmp_path, hosts: str = "all") -> object:
    (tmp_path / "inv.yml").write_text(yaml.safe_dump({"all": {"hosts": {
        h: {"ansible_host": f"10.0.0.{i + 1}"} for i, h in enumerate("abc")}}}))
    (tmp_path / "job.yml").write_text(yaml.safe_dump({
        "name": "zauto", "inventory": "inv.yml", "hosts": hosts, "trainer": {
            "model": MODEL, "train": {"global_batch": 3, "micro_batch": 1, "steps": 4,
                                      "shard_optimizer": "auto"}}}))
    return tmp_path / "job.yml"


def facts(tmp_path, monkeypatch, sizes: dict[str, float]) -> dict[str, HostFacts]:
    monkeypatch.setenv("MLXOPS_HOME", str(tmp_path / "home"))
    out = {}
    for host, gb in sizes.items():
        out[host] = replace(HostFacts.unknown(), memory_bytes=int(gb * GB), system="Linux")
        save_facts(host, out[host])
    return out


def test_auto_shards_every_rank_when_one_node_needs_it_and_the_ranks_get_the_choice(
        tmp_path, monkeypatch):
    spec = load_job(job(tmp_path))
    hosts = select_hosts(spec)
    assert spec.workload.collectives(3) == (ALL_GATHER,)   # undecided: check proves it
    small = shard_spec(spec, hosts, facts(tmp_path, monkeypatch, {"a": BIG, "b": SMALL,
                                                                  "c": BIG}))
    assert small.workload.config.train.shard_optimizer is True
    assert small.workload.collectives(3) == (ALL_GATHER,)
    # The record keeps the choice and that it was auto: a resume decides again.
    record = small.workload.to_record()
    assert record["train"]["shard_optimizer"] is True and record["shard_optimizer_auto"]
    back = type(small.workload).from_record(json.loads(json.dumps(record)))
    assert back == small.workload and back.shard_auto() == "trainer.train.shard_optimizer"

    big = shard_spec(spec, hosts, facts(tmp_path, monkeypatch, dict.fromkeys("abc", BIG)))
    assert big.workload.config.train.shard_optimizer is False
    assert big.workload.collectives(3) == ()                 # nothing gathered, nothing proved


def test_a_job_that_fits_neither_way_is_refused_with_the_numbers(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from mlxops.cli import cli as main

    spec = load_job(job(tmp_path))
    node = facts(tmp_path, monkeypatch, {"a": BIG, "b": 0.5, "c": BIG})
    with pytest.raises(UserError) as e:
        shard_spec(spec, select_hosts(spec), node)
    want = (f"{tmp_path / 'job.yml'}: trainer.train.shard_optimizer: auto: a rank fits "
            "neither unsharded nor sharded: b 0.75 GB unsharded, 0.63 GB sharded, budget "
            "0.40 GB")
    assert str(e.value) == want
    # mlxops launch: refused before pre-flight touches a host (their facts are cached;
    # the hosts' addresses lead nowhere)
    result = CliRunner().invoke(main, ["launch", str(tmp_path / "job.yml"), "--detach"])
    assert result.exit_code == 2 and want in " ".join(result.output.split()), result.output
    one = load_job(job(tmp_path, hosts="b"))   # one rank: nothing to shard over
    with pytest.raises(UserError) as e:
        shard_spec(one, select_hosts(one), node)
    assert str(e.value).endswith("auto: one rank has nothing to shard over and does not "
                                 "fit: b 0.59 GB, budget 0.40 GB")


def test_mlxops_plan_says_which_with_both_peaks_and_the_all_gather(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from mlxops.cli import cli as main

    facts(tmp_path, monkeypatch, {"a": BIG, "b": SMALL, "c": BIG})
    path = job(tmp_path)
    result = CliRunner().invoke(main, ["plan", str(path), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["fits"] and all(n["sharded"] for n in doc["nodes"])
    b = doc["nodes"][1]
    assert not b["unsharded_plan"]["fits"] and b["sharded_plan"] is None
    assert b["unsharded_plan"]["total_bytes"] > b["budget_bytes"] >= b["total_bytes"]
    assert doc["step"]["all_gather"]["bytes"] == 4 * b["params"]
    text = CliRunner().invoke(main, ["plan", str(path)]).output
    assert ("train.shard_optimizer auto: sharded over the ranks (ZeRO-1), the state whole "
            "does not fit: rank peak 764 MB whole, 648 MB sharded, budget 6.4 GB (a, c); "
            "764 MB whole, 648 MB sharded, budget 721 MB (b)") in text, text
    assert "per rank: weights 86.5 MB and its slice of the moments 57.7 MB" in text, text
    assert "+ weights all_gather 90.7 MB: no 'mlxops bench' of these hosts yet" in text

    facts(tmp_path, monkeypatch, dict.fromkeys("abc", BIG))
    result = CliRunner().invoke(main, ["plan", str(path), "--json"])
    doc = json.loads(result.output)
    assert result.exit_code == 0 and not any(n["sharded"] for n in doc["nodes"])
    assert doc["step"]["all_gather"] is None
    assert all(n["unsharded_plan"] is None for n in doc["nodes"])
    assert "train.shard_optimizer auto: not sharded (every rank fits" in \
        CliRunner().invoke(main, ["plan", str(path)]).output
