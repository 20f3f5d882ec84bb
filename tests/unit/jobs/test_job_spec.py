"""Job files: what loads, and a one-line error naming the file and key for what does not."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from mlxops.errors import UserError
from mlxops.jobs.spec import (
    check_balance,
    check_world,
    load_job,
    rank_weights,
)


def rank_config(spec, rank_hosts):
    """The trainer config as the ranks on ``rank_hosts`` get it."""
    return spec.workload.rank_config(rank_weights(spec, rank_hosts))

INVENTORY = {"all": {"hosts": {"a": {"ansible_host": "10.0.0.1"}}}}
GOOD = {
    "name": "tiny",
    "inventory": "inv.yml",
    "trainer": {"model": {"dims": 32, "layers": 1, "heads": 2, "seq_len": 16},
                "train": {"steps": 10}},
}


def write(tmp_path, job):
    (tmp_path / "inv.yml").write_text(yaml.safe_dump(INVENTORY))
    path = tmp_path / "job.yml"
    path.write_text(job if isinstance(job, str) else yaml.safe_dump(job))
    return path


def with_(**changes):
    job = dict(GOOD)
    for key, value in changes.items():
        if value is None:
            job.pop(key, None)
        else:
            job[key] = value
    return job


def test_a_good_job_loads_with_defaults(tmp_path):
    spec = load_job(write(tmp_path, GOOD))
    assert spec.name == "tiny"
    assert spec.inventory == (tmp_path / "inv.yml").resolve()
    assert (spec.hosts, spec.backend) == ("all", "ring")
    assert spec.restart.max_restarts == 3 and spec.restart.stall_timeout == 60
    assert 20000 <= spec.base_port < 40000
    assert spec.base_port == load_job(write(tmp_path, GOOD)).base_port  # stable per name


def test_blas_is_auto_unless_turned_off(tmp_path):
    assert load_job(write(tmp_path, GOOD)).blas == "auto"
    assert load_job(write(tmp_path, with_(blas="auto"))).blas == "auto"
    # YAML reads a bare `off` as false; quoted, it is the word.
    assert load_job(write(tmp_path, yaml.safe_dump(GOOD) + "blas: off\n")).blas == "off"
    assert load_job(write(tmp_path, with_(blas="off"))).blas == "off"


def test_command_jobs_split_a_string_and_take_a_workdir(tmp_path):
    (tmp_path / "work").mkdir()
    spec = load_job(write(tmp_path, with_(trainer=None, command="python train.py --lr 'a b'",
                                          workdir="work", env={"X": 1})))
    assert spec.workload.argv == ("python", "train.py", "--lr", "a b")
    assert spec.workdir == (tmp_path / "work").resolve()
    assert spec.env == {"X": "1"}


BAD = [
    ("name: [unclosed", "invalid YAML: did not find expected ',' or ']' (while parsing a "
                        "flow sequence at line 1)"),
    ("- a list", "a job file is a mapping"),
    (with_(nmae="x"), "nmae: unknown key"),
    (with_(name=None), "name: required"),
    (with_(name="has space"), "name: letters, digits"),
    (with_(name="$(reboot)"), "name: letters, digits"),
    (with_(inventory="missing.yml"), "inventory: no such file"),
    (with_(backend="nccl"), "backend: must be one of ring, mpi, jaccl, jaccl-ring"),
    (with_(hosts=""), "hosts: must be a host pattern"),
    (with_(command=["python", "x.py"]), "trainer: give exactly one of"),
    (with_(trainer=None), "trainer: give exactly one of"),
    (with_(trainer={"model": {"dimz": 3}}), "trainer.model.dimz: unknown key"),
    (with_(trainer={"train": {"steps": "many"}}), "trainer.train.steps: expected int"),
    (with_(trainer={"out": "x"}), "trainer.out: is set by mlxops"),
    (with_(trainer=None, command=""), "command: is empty"),
    (with_(trainer=None, command="python 'unclosed"), "command: cannot split"),
    (with_(workdir="."), "workdir: goes with 'command:'"),
    (with_(env={"A-B": "x"}), "env.A-B: not a valid environment variable name"),
    (with_(env={"A": ["x"]}), "env.A: must be a string or a number"),
    (with_(restart={"max_restart": 1}), "restart.max_restart: unknown key"),
    (with_(restart={"stall_timeout": "soon"}), "restart.stall_timeout: must be a positive"),
    (with_(restart={"max_restarts": -1}), "restart.max_restarts: must be a non-negative"),
    (with_(port=80), "port: must be a port number from 1024 to 65000"),
    (with_(restart={"exclude_unreachable": "yes"}), "restart.exclude_unreachable: must be true"),
    (with_(restart={"poll_interval": -1}), "restart.poll_interval: must be a non-negative"),
    (with_(blas="fast"), "blas: must be auto or off, got 'fast'"),
    (with_(blas=True), "blas: must be auto or off, got True"),
    (with_(alerts=[0.9]), "alerts: must be a mapping (memory_share, tokens_per_sec_drop"),
    (with_(alerts={"memory": 0.9}), "alerts.memory: unknown key (known: heartbeat_age, "
                                    "memory_share, tokens_per_sec_drop, val_loss_rise)"),
    (with_(alerts={"val_loss_rise": -1}), "alerts.val_loss_rise: must be a fraction of the "
                                          "best validation loss (0: off), got -1"),
    (with_(alerts={"memory_share": 1.5}), "alerts.memory_share: must be a share of the node's "
                                          "memory from 0 to 1 (0: off), got 1.5"),
    (with_(alerts={"tokens_per_sec_drop": 1}), "alerts.tokens_per_sec_drop: must be a fraction"),
    (with_(alerts={"heartbeat_age": "30s"}), "alerts.heartbeat_age: must be a number of "
                                             "seconds (0: off), got '30s'"),
    (with_(alerts={"heartbeat_age": -1}), "alerts.heartbeat_age: must be a number of seconds"),
    (with_(alerts={"memory_share": True}), "alerts.memory_share: must be a share"),
    (with_(balance="fast"), "balance: must be equal, auto or a mapping of host: weight"),
    (with_(balance={}), "balance: must be equal, auto or a mapping of host: weight"),
    (with_(balance={"a": 0}), "balance.a: must be a positive number (the host's relative "
                              "speed), got 0"),
    (with_(balance={"a": "fast"}), "balance.a: must be a positive number"),
    (with_(balance={"a": True}), "balance.a: must be a positive number"),
    (with_(trainer=None, command="python x.py", balance="auto"),
     "balance: goes with 'trainer:'"),
    (with_(trainer={"train": {"balance": [1, 2]}}),
     "trainer.train.balance: is set by mlxops from the job's 'balance:'"),
]


def test_alerts_take_defaults_for_what_is_not_set_and_zero_turns_one_off(tmp_path):
    assert load_job(write(tmp_path, GOOD)).alerts == {
        "memory_share": 0.9, "tokens_per_sec_drop": 0.5, "heartbeat_age": 30.0,
        "val_loss_rise": 0.02}
    spec = load_job(write(tmp_path, with_(alerts={"memory_share": 0, "heartbeat_age": 12})))
    assert spec.alerts == {"memory_share": 0.0, "tokens_per_sec_drop": 0.5,
                           "heartbeat_age": 12.0, "val_loss_rise": 0.02}


@pytest.mark.parametrize("job,message", BAD, ids=[m for _, m in BAD])
def test_bad_jobs_get_one_line_naming_file_and_key(tmp_path, job, message):
    with pytest.raises(UserError) as err:
        load_job(write(tmp_path, job))
    text = str(err.value)
    assert text.startswith(str(tmp_path / "job.yml") + ": ")
    assert message in text
    assert "\n" not in text


def test_an_unreadable_job_file(tmp_path):
    with pytest.raises(UserError, match="nope.yml: no such file$"):
        load_job(tmp_path / "nope.yml")


DATA = Path(__file__).parents[1] / "data" / "jobs"
BAD_FILES = sorted((DATA / "bad").glob("*.yml"))


@pytest.mark.parametrize("case", BAD_FILES, ids=lambda p: p.stem)
def test_bad_job_files(case):
    expect = case.read_text().splitlines()[0].removeprefix("# expect: ")
    with pytest.raises(UserError) as err:
        load_job(case)
    assert str(err.value) == f"{case.parent}/{expect}"


def test_merge_keys_load_as_ansible_loads_them():
    spec = load_job(DATA / "good" / "merged.yml")
    # the first merged mapping wins over the second, the mapping's own keys over both
    train = spec.workload.config.train
    assert (train.steps, train.lr, train.warmup, train.global_batch) == (30, 0.01, 2, 6)
    assert (spec.restart.max_restarts, spec.restart.stall_timeout) == (1, 9.0)


@pytest.mark.parametrize("world, ok", [(1, True), (2, True), (3, True), (6, True),
                                       (4, False), (5, False), (12, False)])
def test_check_world_applies_the_trainers_rule(world, ok):
    spec = load_job(DATA / "good" / "merged.yml")  # global_batch 6
    if ok:
        check_world(spec, world)
        return
    with pytest.raises(UserError) as err:
        check_world(spec, world)
    assert str(err.value) == (
        f"{spec.path}: trainer.train.global_batch: 6 is not divisible by the world size "
        f"{world} (each rank takes global_batch / world sequences); the hosts 'all' give "
        f"{world} ranks (their mlxops_slots)")


def test_check_world_leaves_a_command_job_alone(tmp_path):
    spec = load_job(write(tmp_path, with_(trainer=None, command="python x.py")))
    check_world(spec, 7)


def _hosts(*names_slots):
    from types import SimpleNamespace

    return [SimpleNamespace(name=n, slots=s) for n, s in names_slots]


def test_balance_weights_become_the_trainers_per_rank_weights(tmp_path):
    spec = load_job(write(tmp_path, with_(balance={"a": 3, "b": 1})))
    assert spec.balance == {"a": 3.0, "b": 1.0}
    # a host's weight is shared by its ranks
    assert rank_weights(spec, ["a", "a", "b"]) == [1.5, 1.5, 1.0]
    config = rank_config(spec, ["a", "a", "b"])
    assert (config.train.steps, config.train.balance) == (10, [1.5, 1.5, 1.0])
    # the job's own config is unchanged
    assert (spec.workload.config.train.steps, spec.workload.config.train.balance) == (10, "equal")
    check_balance(spec, _hosts(("a", 2), ("b", 1)))
    for mode in ("equal", "auto"):
        other = load_job(write(tmp_path, with_(balance=mode)))
        assert rank_weights(other, ["a", "b"]) == mode
    assert rank_config(load_job(write(tmp_path, GOOD)), ["a"]).train.balance == "equal"


def test_balance_names_exactly_the_jobs_hosts(tmp_path):
    spec = load_job(write(tmp_path, with_(balance={"a": 3, "b": 1})))
    with pytest.raises(UserError, match=r"job\.yml: balance\.b: not a host of this job "
                                        r"\(hosts 'all': a, c\)$"):
        check_balance(spec, _hosts(("a", 1), ("c", 1)))
    with pytest.raises(UserError, match=r"job\.yml: balance: no weight for c "):
        check_balance(spec, _hosts(("a", 1), ("b", 1), ("c", 1)))


def test_check_world_with_a_balance_needs_no_divisible_batch(tmp_path):
    job = with_(balance={"a": 3, "b": 1},
                trainer={"train": {"steps": 10, "global_batch": 7}})
    spec = load_job(write(tmp_path, job))
    check_world(spec, 2, ["a", "b"])  # 7 over unequal ranks: fine
    with pytest.raises(UserError, match="7 is not divisible by the world size 2"):
        check_world(load_job(write(tmp_path, with_(trainer=job["trainer"]))), 2, ["a", "b"])


# --- finetune: ------------------------------------------------------------------------------

def finetune_job(tmp_path, **section):
    model, data = tmp_path / "models" / "tiny", tmp_path / "chat"
    model.mkdir(parents=True)
    data.mkdir()
    (model / "config.json").write_text("{}")
    (data / "train.jsonl").write_text("")
    (data / "valid.jsonl").write_text("")
    body = {"model": {"path": "models/tiny"}, "data": {"path": "chat"},
            "train": {"steps": 20, "global_batch": 4}}
    for key, value in section.items():
        body[key] = {**body.get(key, {}), **value}
    return write(tmp_path, with_(trainer=None, finetune=body)), model, data


def test_a_finetune_job_is_parsed_into_its_config_with_its_paths_made_absolute(tmp_path):
    from mlxops.finetune.config import FinetuneConfig

    path, model, data = finetune_job(tmp_path, method={"type": "dora", "rank": 4})
    spec = load_job(path)
    cfg = spec.workload.config
    assert spec.workload.kind == "finetune" and isinstance(cfg, FinetuneConfig)
    assert (cfg.method.type, cfg.method.rank) == ("dora", 4)
    assert cfg.model.path == str(model) and cfg.data.path == str(data)
    assert spec.needs_mlx_lm and spec.total_steps == 20


@pytest.mark.parametrize("remove, key, message", [
    ("models/tiny/config.json", "finetune.model.path",
     "models/tiny has no config.json (a model in the Hugging Face / mlx-lm layout)"),
    ("chat/train.jsonl", "finetune.data.path", "chat has no train.jsonl"),
    ("chat/valid.jsonl", "finetune.data.path", "chat has no valid.jsonl"),
])
def test_the_model_and_data_directories_are_checked_at_load(tmp_path, remove, key, message):
    path, _, _ = finetune_job(tmp_path)
    (tmp_path / remove).unlink()
    with pytest.raises(UserError) as err:
        load_job(path)
    assert str(err.value) == f"{path}: {key}: {message}" + (
        " (mlx-lm's data directory)" if "jsonl" in remove else "")


def test_without_validation_valid_jsonl_is_not_needed(tmp_path):
    path, _, data = finetune_job(tmp_path, train={"eval_every": 0})
    (data / "valid.jsonl").unlink()
    assert load_job(path).workload.config.train.eval_every == 0


def test_check_world_applies_the_finetune_rule_and_the_jobs_balance(tmp_path):
    path, _, _ = finetune_job(tmp_path)
    spec = load_job(path)
    check_world(spec, 2, ["a", "a"])
    with pytest.raises(UserError, match=r"job.yml: finetune.train.global_batch: 4 is not "
                                        r"divisible by the world size 3 .*; the hosts 'all' "
                                        r"give 3 ranks"):
        check_world(spec, 3, ["a", "a", "a"])
    weighted = dataclasses.replace(spec, balance={"a": 1.0})
    check_world(weighted, 3, ["a", "a", "a"])   # weights: any split of 4 over 3 ranks


def test_a_finetune_rank_gets_the_nodes_copies_the_run_directory_and_the_split(tmp_path):
    path, model, data = finetune_job(tmp_path)
    spec = dataclasses.replace(load_job(path), balance={"a": 3.0})
    cfg = spec.workload.rank_config("/home/u/.mlxops", "/home/u/.mlxops/runs/tiny",
                                    rank_weights(spec, ["a", "a"]))
    assert cfg.model.path.startswith("/home/u/.mlxops/data/tiny-")
    assert cfg.data.path.startswith("/home/u/.mlxops/data/chat-")
    assert cfg.out == "/home/u/.mlxops/runs/tiny"
    assert cfg.train.balance == [1.5, 1.5]
    assert spec.workload.config.model.path == str(model)   # the job's own is unchanged


def test_the_record_keeps_the_finetune_config_and_reads_it_back(tmp_path):
    from mlxops.jobs.record import launched_job

    path, _, _ = finetune_job(tmp_path, train={"lr": 2e-4})
    spec = load_job(path)
    kept = launched_job(spec)
    assert kept["finetune"]["train"]["lr"] == 2e-4 and "trainer" not in kept
    from mlxops.finetune.config import from_dict
    assert from_dict(kept["finetune"], "job.finetune") == spec.workload.config
