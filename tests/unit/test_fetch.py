"""``mlxops fetch``'s node command, run by a real ``sh`` (dash here, as a node's /bin/sh)
over run directories laid out as a fine-tuning run writes them, and its answer read back."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from mlxops.errors import UserError
from mlxops.jobs import fetch as F
from mlxops.node import protocol


def checkpoint(run: Path, where: str, step: int, complete: bool = True) -> Path:
    d = run / where
    d.mkdir(parents=True)
    (d / F.ADAPTERS).write_bytes(f"weights of step {step}".encode() + bytes(range(256)))
    (d / F.ADAPTER_CONFIG).write_text(json.dumps({"fine_tune_type": "lora"}))
    if complete:
        (d / protocol.CKPT_STATE).write_text(json.dumps({"step": step}))
    return d


@pytest.fixture
def run(tmp_path) -> Path:
    run = tmp_path / "runs dir" / "job"     # a space: every path is quoted
    for step in (10, 20):
        checkpoint(run, f"ckpt/{protocol.checkpoint_name(step)}", step)
    (run / "ckpt" / protocol.LATEST).write_text(protocol.checkpoint_name(20) + "\n")
    checkpoint(run, f"{protocol.BEST_DIR}/{protocol.checkpoint_name(10)}", 10)
    (run / protocol.BEST_DIR / protocol.LATEST).write_text(protocol.checkpoint_name(10))
    return run


def ask(run: Path, where: str = protocol.CKPT_DIR, step: int | None = None
        ) -> subprocess.CompletedProcess:
    return subprocess.run(["/bin/sh", "-c", F.fetch_command(str(run), where, step)],
                          capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("best, step, directory, want", [
    (False, None, "ckpt/step-00000020", 20),   # the newest: what ckpt/latest names
    (True, None, "best/step-00000010", 10),
    (False, 10, "ckpt/step-00000010", 10),
])
def test_the_chosen_checkpoints_adapters_come_back_whole(run, best, step, directory, want):
    proc = ask(run, *F.which_dir(best, step))
    assert proc.returncode == 0, proc.stderr
    got, files = F.parse_answer(proc.stdout)
    assert got == directory and F.step_of(files) == want
    assert files[F.ADAPTERS] == (run / directory / F.ADAPTERS).read_bytes()
    assert json.loads(files[F.ADAPTER_CONFIG]) == {"fine_tune_type": "lora"}


def test_latest_naming_an_incomplete_checkpoint_falls_back_to_the_newest_complete(run):
    checkpoint(run, "ckpt/step-00000030", 30, complete=False)
    (run / "ckpt" / protocol.LATEST).write_text("step-00000030\n")
    got, files = F.parse_answer(ask(run).stdout)
    assert (got, F.step_of(files)) == ("ckpt/step-00000020", 20)


def test_a_checkpoint_that_is_not_there_is_said_so_with_its_own_exit_code(run, tmp_path):
    proc = ask(run, *F.which_dir(step=99))
    assert proc.returncode == F.NOT_THERE
    assert proc.stderr.strip() == "no adapters in ckpt/step-00000099"
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = ask(empty)
    assert proc.returncode == F.NOT_THERE and "no adapters in ckpt/" in proc.stderr
    assert ask(tmp_path / "nope").returncode == F.NOT_THERE
    assert ask(empty, *F.which_dir(best=True)).stderr.strip() == "no adapters in best/"


def test_best_and_step_together_are_bad_input():
    with pytest.raises(UserError, match="--best and --step: choose one"):
        F.which_dir(True, 5)


def test_damaged_or_partial_answers_are_refused(run):
    with pytest.raises(F.FetchError, match="unexpected answer"):
        F.parse_answer("Traceback ...\n")
    proc = ask(run)
    head, _, body = proc.stdout.partition("\n")
    with pytest.raises(F.FetchError, match="damaged"):
        F.parse_answer(f"{head}\n{body[: len(body) // 2]}")


def test_written_in_mlx_lms_layout_without_the_checkpoints_state(run, tmp_path):
    source, files = F.parse_answer(ask(run, *F.which_dir(best=True)).stdout)
    out = tmp_path / "out" / "adapters"
    written = F.write_out(files, out)
    assert sorted(p.name for p in out.iterdir()) == sorted(F.FETCHED)
    assert written[F.ADAPTERS] == (run / source / F.ADAPTERS).stat().st_size


class LocalConnector:
    """A connector whose every host runs the command in a local ``sh`` (the node's side
    as in the tests above)."""

    def connect(self, host):
        return self

    def run(self, command, timeout=None):
        from mlxops.transport.connection import CommandResult

        proc = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True,
                              timeout=30)
        return CommandResult(command, proc.returncode, proc.stdout, proc.stderr, 0.0)


def test_the_fetched_config_names_the_controllers_model_not_the_nodes_copy(tmp_path,
                                                                           monkeypatch):
    """A rank wrote mlx-lm's ``model``/``data`` keys as its node's copies (what it read);
    mlx-lm's loaders read neither back, a person or a tool on the controller does, to find
    the base model the adapters go with: the controller's directories, as the job gave."""
    from mlxops.finetune.config import FinetuneConfig
    from mlxops.jobs.placement import Rank
    from mlxops.jobs.record import HostRecord, JobRecord
    from mlxops.jobs.workloads.finetune import FinetuneWorkload

    cfg = FinetuneConfig()
    cfg.model.path, cfg.data.path = str(tmp_path / "models" / "tiny"), str(tmp_path / "chat")
    root = tmp_path / "node root"
    run = root / "runs" / "ft"
    checkpoint(run, f"ckpt/{protocol.checkpoint_name(5)}", 5)
    node_copy = f"{root}/data/tiny-0123abcd"
    config = run / "ckpt" / protocol.checkpoint_name(5) / F.ADAPTER_CONFIG
    config.write_text(json.dumps({"fine_tune_type": "lora", "num_layers": 2,
                                  "model": node_copy, "data": f"{root}/data/chat-4567"}))
    record = JobRecord(name="ft", job_file="/j.yml", inventory="/inv.yml", backend="ring",
                       hosts=[HostRecord("a", str(root), "/py")],
                       ranks=[Rank(0, "a", "10.0.0.1", 30000, 0)],
                       workload=FinetuneWorkload(cfg), job={})
    monkeypatch.setattr(F, "inventory_hosts", lambda record: {"a": object()})

    got = F.fetch(record, LocalConnector(), tmp_path / "out")

    written = json.loads((tmp_path / "out" / F.ADAPTER_CONFIG).read_text())
    assert written == {"fine_tune_type": "lora", "num_layers": 2,
                       "model": cfg.model.path, "data": cfg.data.path}
    assert got.files[F.ADAPTER_CONFIG] == (tmp_path / "out" / F.ADAPTER_CONFIG).stat().st_size


def test_only_a_job_that_writes_adapters_has_any_to_fetch(tmp_path):
    from mlxops.jobs.record import JobRecord
    from mlxops.jobs.workloads.command import CommandWorkload

    record = JobRecord(name="c", job_file="/j.yml", inventory="/inv.yml", backend="ring",
                       hosts=[], ranks=[], workload=CommandWorkload(("python", "x.py")), job={})
    with pytest.raises(UserError, match="not a fine-tuning job"):
        F.fetch(record, LocalConnector(), tmp_path / "out")
