"""Fine-tuning jobs (issue 18) on two sandbox nodes, as a user runs them.

A LoRA on the tiny llama (mlxops/devtools/tinymodels.py: mlx-lm's own classes, random
weights, a tokenizer trained here) learns the chat data; the model and the data reach the
nodes through pre-flight (hash-checked, under each node root). Three runs of the same
12 steps, made once for the module, that the tests read:

- ``straight``: uninterrupted, on 2 ranks: the curve the others are held to;
- ``interrupted``: stopped by ``mlxops stop`` mid-run and resumed, then rank 1 killed with
  SIGKILL and recovered by the watchdog: bit for bit the straight curve;
- ``uneven``: ``balance: {node1: 3, node2: 1}``, stopped, then resumed without node2
  (``resume --exclude``, the same global batch on one rank): every step within float
  tolerance, 1e-4 relative (the loss is token-weighted and the dropout masks follow the
  example, so the split changes only the order of summation; see TOLERANCE).

Then ``mlxops fetch --best`` brings the adapters, which ``mlx_lm.generate`` loads.
Rank 1 sleeps a little each step (MLXOPS_TRAINER_FAKE_SLOW; the numbers do not change)
so that a stop or a kill lands mid-run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from job_helpers import BackgroundWatchdog, run_dir, wait_for_step

from mlxops.jobs.content import Content
from mlxops.jobs.launch import launch
from mlxops.jobs.record import load_record
from mlxops.jobs.spec import load_job
from mlxops.jobs.stop import stop_job
from mlxops.jobs.watch import supervise
from mlxops.node import protocol
from mlxops.node.protocol.layout import DATA_DIR
from mlxops.transport import Connector

HOSTS = "node1,node2"
STEPS = 12
# Relative, as the bundled trainer's resume on another world size. Another split sums in
# another order: 2 local ranks against 1 on these settings differ by 3e-7 at most over the
# 12 steps (1 ulp at step 1). At lr 2e-3 this tiny model is past stable training (its
# validation loss rises by step 12) and amplifies the same ulp to 4e-3 by step 12.
TOLERANCE = 1e-4
FINETUNE = {
    "method": {"type": "lora", "rank": 4, "num_layers": -1, "dropout": 0.1},
    "data": {"mask_prompt": True},
    "train": {"lr": 1e-3, "steps": STEPS, "global_batch": 4, "max_seq_len": 64, "eval_every": 4,
              "eval_batches": 1, "checkpoint_every": 2, "keep": 2, "log_every": 1},
}
SLOW = {"MLXOPS_TRAINER_FAKE_SLOW": "1:0.4"}


def write_job(tmp: Path, sandbox, name: str, model: Path, data: Path, **extra) -> Path:
    section = json.loads(json.dumps(FINETUNE))
    section["model"] = {"path": str(model)}
    section["data"]["path"] = str(data)
    job = {"name": name, "inventory": str(sandbox.inventory_path), "hosts": HOSTS,
           "finetune": section, "restart": {"max_restarts": 2, "stall_timeout": 60},
           **extra}
    path = tmp / f"{name}.yml"
    path.write_text(yaml.safe_dump(job))
    return path


def curve(sandbox, name: str) -> dict[int, tuple[float, float | None]]:
    """step -> (loss, val_loss) from rank 0's metrics; a re-done step keeps its last."""
    out = {}
    for line in (run_dir(sandbox, "node1", name) / protocol.METRICS).read_text().splitlines():
        rec = json.loads(line)
        out[rec["step"]] = (rec["loss"], rec.get("val_loss"))
    return out


def splits(sandbox, name: str) -> list[list[int]]:
    lines = (run_dir(sandbox, "node1", name) / protocol.METRICS).read_text().splitlines()
    return [json.loads(line).get("batch_split") for line in lines]


def rank_pid(sandbox, name: str, rank: int, node: str) -> int:
    """The fine-tuning process of ``rank`` (the child of its start script's group)."""
    pgid = int((run_dir(sandbox, node, name) / f"rank-{rank}.pid").read_text())
    children = subprocess.run(["pgrep", "-P", str(pgid)], capture_output=True, text=True)
    return int(children.stdout.split()[0])


@pytest.fixture(scope="module")
def runs(sandbox, tmp_path_factory):
    from mlxops.devtools.tinymodels import build_model, write_dataset

    tmp = tmp_path_factory.mktemp("finetune")
    home = tmp / "home"
    model = build_model(tmp / "models" / "llama", "llama")
    data = write_dataset(tmp / "data" / "chat", "chat")
    out = {"tmp": tmp, "home": home, "model": model, "data": data, "events": {}}
    with pytest.MonkeyPatch.context() as mp, Connector() as connector:
        mp.setenv("MLXOPS_HOME", str(home))
        started = time.monotonic()
        straight = launch(load_job(write_job(tmp, sandbox, "ft-straight", model, data)),
                          connector)
        out["straight"] = supervise(straight, connector)
        out["straight_s"] = time.monotonic() - started

        # Stop mid-run, resume; then kill -9 a rank and let the watchdog recover it.
        spec = load_job(write_job(tmp, sandbox, "ft-interrupted", model, data, env=SLOW))
        record = launch(spec, connector)
        wait_for_step(record, connector, 4, timeout=180)
        out["stop"] = stop_job(record, connector).exit_code
        resumed = launch(spec, connector, resume=True,
                         previous=load_record("ft-interrupted"))
        out["resumed_from"] = resumed.message
        watchdog = BackgroundWatchdog(resumed, connector)
        wait_for_step(resumed, connector, 8, timeout=180)
        os.kill(rank_pid(sandbox, "ft-interrupted", 1, "node2"), signal.SIGKILL)
        out["interrupted"] = watchdog.result(timeout=300)
        out["restarts"] = load_record("ft-interrupted").restarts

        # Unequal nodes, then on without node2.
        # Slower still: the stop must land early enough for one rank to run a few steps.
        spec = load_job(write_job(tmp, sandbox, "ft-uneven", model, data,
                                  env={"MLXOPS_TRAINER_FAKE_SLOW": "1:1.0"},
                                  balance={"node1": 3, "node2": 1}))
        record = launch(spec, connector)
        wait_for_step(record, connector, 2, timeout=180)
        stop_job(record, connector)
        alone = launch(spec, connector, resume=True, exclude=["node2"],
                       previous=load_record("ft-uneven"))
        out["alone"] = alone
        out["uneven"] = supervise(alone, connector)
    return out


def test_a_lora_job_trains_on_two_nodes_and_keeps_its_best(runs, sandbox):
    final = runs["straight"]
    assert final.state == "finished", final.to_dict()
    assert all(r.state == "finished" and r.step == STEPS for r in final.ranks)
    seen = curve(sandbox, "ft-straight")
    assert sorted(seen) == list(range(1, STEPS + 1))
    vals = {s: seen[s][1] for s in (4, 8, 12)}
    best_step = min(vals, key=vals.get)
    assert best_step > 4, vals   # validation loss falls (12 steps may over-fit: best/ keeps)
    for node in HOSTS.split(","):
        best = run_dir(sandbox, node, "ft-straight") / protocol.BEST_DIR
        kept = (best / protocol.LATEST).read_text().strip()
        assert kept == protocol.checkpoint_name(best_step)
        assert (best / kept / "adapters.safetensors").is_file()
    # The base model and the data were placed under each node root, every file of them.
    for node in HOSTS.split(","):
        for local in (runs["model"], runs["data"]):
            placed = (sandbox.node_home(node) / ".mlxops" / DATA_DIR
                      / Path(Content(local, {}).node_dir("/")).name)
            assert sorted(p.name for p in placed.iterdir()) == sorted(
                p.name for p in local.iterdir())


def test_stop_resume_and_kill_9_recovery_give_the_straight_curve_bit_for_bit(runs, sandbox):
    assert runs["stop"] == 0
    start = int(runs["resumed_from"].removeprefix("resumed from step "))
    assert 2 <= start < 8 and start % 2 == 0, runs["resumed_from"]   # checkpoint_every 2
    final = runs["interrupted"]
    assert final.state == "finished", final.to_dict()
    assert len(runs["restarts"]) == 1 and "rank 1 on node2" in runs["restarts"][0].reason
    assert curve(sandbox, "ft-interrupted") == curve(sandbox, "ft-straight")


def test_unequal_nodes_then_resume_without_one_keep_the_global_batch(runs, sandbox):
    assert runs["alone"].world_size == 1 and runs["alone"].excluded == ["node2"]
    start = int(runs["alone"].message.removeprefix("resumed from step "))
    assert start < STEPS, runs["alone"].message   # one rank ran steps
    assert runs["uneven"].state == "finished", runs["uneven"].to_dict()
    seen = splits(sandbox, "ft-uneven")
    assert seen[0] == [3, 1] and seen[-1] == [4]
    want, got = curve(sandbox, "ft-straight"), curve(sandbox, "ft-uneven")
    assert sorted(got) == list(range(1, STEPS + 1))
    for step, (loss, val) in want.items():
        assert abs(got[step][0] - loss) <= TOLERANCE * abs(loss), (step, got[step], loss)
        if val is not None:
            assert abs(got[step][1] - val) <= TOLERANCE * abs(val), (step, got[step], val)


def test_fetched_best_adapters_load_in_mlx_lm_generate(runs, tmp_path, monkeypatch):
    monkeypatch.setenv("MLXOPS_HOME", str(runs["home"]))
    out = tmp_path / "adapters"
    proc = subprocess.run([sys.executable, "-m", "mlxops", "fetch", "ft-straight", "--best",
                           "-o", str(out), "--json"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["host"] == "node1" and doc["source"].startswith("best/step-")
    assert sorted(p.name for p in out.iterdir()) == ["adapter_config.json",
                                                     "adapters.safetensors"]
    # The config names the base model as this controller has it (the rank wrote its
    # node's copy, under the node's root): the --model these adapters go with here.
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["model"] == str(runs["model"]) and config["data"] == str(runs["data"])
    generate = Path(sys.executable).with_name("mlx_lm.generate")
    proc = subprocess.run([str(generate), "--model", str(runs["model"]), "--adapter-path",
                           str(out), "--prompt", "What does json do?", "--max-tokens", "8"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Generation:" in proc.stdout or "tokens-per-sec" in proc.stdout, proc.stdout
