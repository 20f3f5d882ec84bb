"""Training on token shards with real ring ranks on this machine: validation, the best
checkpoint, patience, and exact resume with read-ahead on (stop + resume, kill -9, 2 -> 1)."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest
from shard_corpus import markov_corpus
from trainer_procs import losses, ok, run_trainer, write_config

from mlxops.trainer import checkpoint

MODEL = {"vocab_size": 64, "seq_len": 32}
TRAIN = {"steps": 30, "global_batch": 8, "micro_batch": 4, "warmup": 3, "eval_every": 10,
         "eval_batches": 2, "checkpoint_every": 10, "log_every": 1}


def config(tmp: Path, out: Path, corpus: Path, **train) -> Path:
    return write_config(tmp, out, model=MODEL, train={**TRAIN, **train},
                        data={"source": "shards", "path": str(corpus), "prefetch": 2})


def val_losses(out: Path) -> dict[int, float]:
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["val_loss"] for r in recs if r.get("val_loss") is not None}


@pytest.fixture(scope="module")
def shard_runs(tmp_path_factory):
    """A 2-rank run of 30 steps straight, and one stopped after 15 (checkpoint at 15)."""
    tmp = tmp_path_factory.mktemp("shard-runs")
    corpus = markov_corpus(tmp / "corpus")
    ok(run_trainer(config(tmp, tmp / "straight", corpus), ranks=2))
    ok(run_trainer(config(tmp, tmp / "half", corpus, stop_at=15), ranks=2))
    return tmp, corpus


def test_validation_loss_falls_and_the_best_checkpoint_is_kept_apart(shard_runs):
    tmp, _ = shard_runs
    out = tmp / "straight"
    val = val_losses(out)
    assert sorted(val) == [10, 20, 30]
    assert val[30] < val[10] - 0.3
    best = min(val, key=val.get)
    assert (out / "best" / "latest").read_text().strip() == f"step-{best:08d}"
    assert [p.name for p in checkpoint.list_complete(out / "best")] == [f"step-{best:08d}"]
    state = json.loads((out / "ckpt" / "step-00000030" / "state.json").read_text())
    assert state["validation"]["best_step"] == best and state["validation"]["evaluations"] == 3
    cursor = state["data_position"]
    assert cursor["sample"] == 30 * 8 and cursor["seed"] == 1
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert math.isclose(recs[9]["val_perplexity"], math.exp(recs[9]["val_loss"]))


def test_stop_and_resume_with_prefetch_is_bitwise(shard_runs):
    tmp, corpus = shard_runs
    out = tmp / "resumed"
    shutil.copytree(tmp / "half", out)
    ok(run_trainer(config(tmp, out, corpus), "--resume", ranks=2))
    ref, got = losses(tmp / "straight"), losses(out)
    assert sorted(got) == list(range(1, 31))
    assert [got[s] for s in range(16, 31)] == [ref[s] for s in range(16, 31)]
    assert val_losses(out) == val_losses(tmp / "straight")


def test_a_resume_on_one_rank_reads_the_same_batches(shard_runs):
    tmp, corpus = shard_runs
    out = tmp / "one-rank"
    shutil.copytree(tmp / "half", out)
    proc = ok(run_trainer(config(tmp, out, corpus), "--resume"))
    assert "now world 1" in proc.stdout
    ref, got = losses(tmp / "straight"), losses(out)
    for s in range(16, 31):
        assert math.isclose(got[s], ref[s], rel_tol=1e-4), (s, got[s], ref[s])


def _rank_pids(config_path: Path) -> list[int]:
    """The processes this test started with ``config_path`` on their command line."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                args = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if str(config_path).encode() in args:
                pids.append(int(entry.name))
    return pids


def test_kill_9_of_a_rank_then_resume_is_bitwise(shard_runs):
    tmp, corpus = shard_runs
    out = tmp / "killed"
    cfg = config(tmp, out, corpus)
    killed: list[int] = []
    # The ranks wait after step 20 (its checkpoint written) while this file says 20 (the
    # trainer's hold hook): the kill lands mid-run however fast the machine is (a quick
    # run once logged step 30 before it landed).
    hold = tmp / "hold-killed"
    hold.write_text("20\n")

    def kill_after_checkpoint_20() -> None:
        deadline = time.time() + 120
        while time.time() < deadline and not (out / "ckpt" / "step-00000020" /
                                               "state.json").exists():
            time.sleep(0.02)
        pids = _rank_pids(cfg)
        if pids:
            os.kill(pids[-1], signal.SIGKILL)
            killed.append(pids[-1])
        hold.unlink()  # the other rank goes on, and fails at its peer's absence

    killer = threading.Thread(target=kill_after_checkpoint_20)
    killer.start()
    try:
        proc = run_trainer(cfg, ranks=2, timeout=180, env={"MLXOPS_TRAINER_HOLD": str(hold)})
    finally:
        killer.join()
        hold.unlink(missing_ok=True)
    assert killed and proc.returncode != 0
    assert max(losses(out)) < 30
    ok(run_trainer(cfg, "--resume", ranks=2))
    ref, got = losses(tmp / "straight"), losses(out)
    assert [got[s] for s in range(1, 31)] == [ref[s] for s in range(1, 31)]


def test_patience_ends_the_run_resumably(tmp_path):
    corpus = markov_corpus(tmp_path / "corpus")
    out = tmp_path / "patient"
    # A rate this high leaves the minimum at once: validation stops improving.
    cfg = config(tmp_path, out, corpus, steps=40, eval_every=2, patience=2, lr=0.5,
                 warmup=0, checkpoint_every=100)
    proc = ok(run_trainer(cfg))
    assert "patience: 2 evaluations without a new best" in proc.stdout
    ended = max(losses(out))
    assert ended < 40
    assert checkpoint.find_latest(out / "ckpt").name == f"step-{ended:08d}"
    again = ok(run_trainer(cfg, "--resume"))     # the same patience: ends at once
    assert "patience: 2 evaluations" in again.stdout and max(losses(out)) == ended
    more = config(tmp_path, out, corpus, steps=40, eval_every=2, patience=50, lr=0.5,
                  warmup=0, checkpoint_every=100)
    ok(run_trainer(more, "--resume"))
    assert max(losses(out)) == 40
