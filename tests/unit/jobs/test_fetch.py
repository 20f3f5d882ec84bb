"""``mlxops fetch``: the node's ``send`` command (a real ``python -m mlxops.node send`` run by
``/bin/sh`` over a local connection) over run directories laid out as a fine-tuning run
writes them, its stream read back by the one download helper (jobs/download.py), and the
adapters written as one set."""

from __future__ import annotations

import io
import json
import sys
import tarfile
from pathlib import Path

import pytest

from mlxops.errors import UserError
from mlxops.finetune.config import FinetuneConfig
from mlxops.jobs import download as D
from mlxops.jobs import fetch as F
from mlxops.jobs.placement import Rank
from mlxops.jobs.record import HostRecord, JobRecord
from mlxops.jobs.workloads.finetune import FinetuneWorkload
from mlxops.node import protocol
from mlxops.node.protocol.send import SendAnswer, send_args, send_checkpoint_args
from mlxops.transport import Connector, LocalConnection

ROOT = Path(__file__).resolve().parents[3]


def checkpoint(run: Path, where: str, step: int, complete: bool = True) -> Path:
    d = run / where
    d.mkdir(parents=True)
    (d / F.ADAPTERS).write_bytes(f"weights of step {step}".encode() + bytes(range(256)))
    (d / F.ADAPTER_CONFIG).write_text(json.dumps({"fine_tune_type": "lora", "step": step}))
    (d / protocol.CKPT_MODEL).write_bytes(b"m")
    (d / protocol.CKPT_OPTIMIZER).write_bytes(b"o")
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


def ask(run: Path, into: Path, where: str = protocol.CKPT_DIR, step: int | None = None):
    into.mkdir(exist_ok=True)
    command = D.send_command(sys.executable, str(ROOT), send_checkpoint_args(
        str(run), where, F.FETCHED, step=step))
    return D.download(LocalConnection("here"), command, into)


@pytest.mark.parametrize("best, step, directory, want", [
    (False, None, "ckpt/step-00000020", 20),   # the newest: what ckpt/latest names
    (True, None, "best/step-00000010", 10),
    (False, 10, "ckpt/step-00000010", 10),
])
def test_the_chosen_checkpoints_adapters_come_back_whole(run, tmp_path, best, step,
                                                         directory, want):
    got, result = ask(run, tmp_path / "got", *F.which_dir(best, step))
    assert result.ok, result.stderr
    assert (got.answer.directory, got.answer.step) == (directory, want)
    for name in F.FETCHED:
        assert (tmp_path / "got" / name).read_bytes() == (run / directory / name).read_bytes()
    assert got.written == {n: (run / directory / n).stat().st_size for n in F.FETCHED}
    assert sorted(p.name for p in (tmp_path / "got").iterdir()) == sorted(F.FETCHED)


def test_latest_naming_an_incomplete_checkpoint_falls_back_to_the_newest_complete(run,
                                                                                  tmp_path):
    checkpoint(run, "ckpt/step-00000030", 30, complete=False)
    (run / "ckpt" / protocol.LATEST).write_text("step-00000030\n")
    got, _ = ask(run, tmp_path / "got")
    assert (got.answer.directory, got.answer.step) == ("ckpt/step-00000020", 20)


def test_a_checkpoint_that_is_not_there_is_said_so_and_nothing_is_sent(run, tmp_path):
    got, result = ask(run, tmp_path / "a", *F.which_dir(step=99))
    assert result.ok and got.answer.missing == "no complete checkpoint ckpt/step-00000099"
    assert not any((tmp_path / "a").iterdir())
    empty = tmp_path / "empty"
    empty.mkdir()
    assert ask(empty, tmp_path / "b")[0].answer.missing == "no complete checkpoint in ckpt/"
    assert ask(empty, tmp_path / "c", *F.which_dir(best=True))[0].answer.missing == (
        "no complete checkpoint in best/")
    (run / "ckpt" / "step-00000020" / F.ADAPTERS).unlink()
    assert ask(run, tmp_path / "d")[0].answer.missing.startswith(f"no {F.ADAPTERS} in ")


def test_best_and_step_together_are_bad_input():
    with pytest.raises(UserError, match="--best and --step: choose one"):
        F.which_dir(True, 5)


def stream(answer: SendAnswer, members: dict[str, bytes], cut: int | None = None) -> io.BytesIO:
    body = io.BytesIO()
    with tarfile.open(fileobj=body, mode="w|") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    raw = (protocol.answer_line(answer) + "\n").encode() + body.getvalue()
    return io.BytesIO(raw[:cut] if cut else raw)


def test_a_damaged_cut_or_foreign_stream_is_refused(tmp_path):
    named = SendAnswer("ckpt/step-00000020", {"a": 3, "b": 2})
    ok = D.receive("n1", stream(named, {"a": b"abc", "b": b"de"}), tmp_path)
    assert ok.written == {"a": 3, "b": 2}
    cases = {
        "ended before b": stream(named, {"a": b"abc"}),
        "not one of the files": stream(named, {"a": b"abc", "../b": b"de"}),
        "2 bytes sent, 3 named": stream(named, {"a": b"ab", "b": b"de"}),
        "damaged": stream(named, {"a": b"abc", "b": b"de"}, cut=200),
    }
    for said, body in cases.items():
        with pytest.raises(D.DownloadError, match=said):
            D.receive("n1", body, tmp_path / said.replace(" ", "_"))


def test_lines_before_the_answer_are_kept_and_a_failure_before_it_is_no_answer(tmp_path):
    body = stream(SendAnswer("out", {"a": 1}), {"a": b"x"})
    got = D.receive("n1", io.BytesIO(b'{"step": 40}\n' + body.read()), tmp_path)
    assert got.before == ['{"step": 40}'] and got.written == {"a": 1}
    assert D.receive("n1", io.BytesIO(b"Traceback ...\n"), tmp_path).answer is None


def test_a_directory_is_sent_whole_with_its_subdirectories(tmp_path):
    source = tmp_path / "export"
    (source / "sub").mkdir(parents=True)
    (source / "config.json").write_text("{}")
    (source / "sub" / "w.safetensors").write_bytes(bytes(70000))
    into = tmp_path / "into"
    into.mkdir()
    got, result = D.download(LocalConnection("here"), D.send_command(
        sys.executable, str(ROOT), send_args(str(source))), into)
    assert result.ok and got.answer.files == {"config.json": 2, "sub/w.safetensors": 70000}
    assert (into / "sub" / "w.safetensors").read_bytes() == bytes(70000)


def test_hard_linked_files_are_each_sent_as_a_regular_file(tmp_path):
    """A fine-tuning checkpoint's adapters.safetensors is a hard link of its
    model.safetensors (finetune/model.py): both come whole (a pipeline stage's checkpoint
    is sent so to another node before a resume on another split)."""
    source = tmp_path / "step"
    source.mkdir()
    (source / protocol.CKPT_MODEL).write_bytes(b"w" * 300)
    (source / F.ADAPTERS).hardlink_to(source / protocol.CKPT_MODEL)
    into = tmp_path / "into"
    into.mkdir()
    got, result = D.download(LocalConnection("here"), D.send_command(
        sys.executable, str(ROOT), send_args(str(source))), into)
    assert result.ok and got.written == {F.ADAPTERS: 300, protocol.CKPT_MODEL: 300}
    assert (into / protocol.CKPT_MODEL).read_bytes() == b"w" * 300


# --- mlxops fetch as a whole ---------------------------------------------------------------

@pytest.fixture
def job(tmp_path, monkeypatch, run):
    """A fine-tuning job on a local host whose node root holds ``run`` and the code."""
    monkeypatch.setenv("MLXOPS_HOME", str(tmp_path / "home"))
    root = tmp_path / "root"
    (root / "runs").mkdir(parents=True)
    (root / "runs" / "ft").symlink_to(run)
    (root / "code").symlink_to(ROOT)
    inventory = tmp_path / "inventory.yml"
    inventory.write_text("all:\n  hosts:\n    a: {ansible_connection: local}\n")
    cfg = FinetuneConfig()
    cfg.model.path, cfg.data.path = str(tmp_path / "models" / "tiny"), str(tmp_path / "chat")
    return JobRecord(name="ft", job_file="j.yml", inventory=str(inventory), backend="ring",
                     hosts=[HostRecord("a", str(root), sys.executable)],
                     ranks=[Rank(0, "a", "127.0.0.1", 5000, 0)], state="finished",
                     workload=FinetuneWorkload(cfg), job={})


def test_fetch_writes_the_adapters_and_their_config_as_one_set(job, run, tmp_path):
    out = tmp_path / "out" / "adapters"
    with Connector() as connector:
        first = F.fetch(job, connector, out, best=True)
        assert (first.host, first.source, first.step) == ("a", "best/step-00000010", 10)
        assert json.loads((out / F.ADAPTER_CONFIG).read_text())["step"] == 10
        inode = out.stat().st_ino
        again = F.fetch(job, connector, out)
    assert again.step == 20 and out.stat().st_ino != inode   # a new set, renamed in
    assert json.loads((out / F.ADAPTER_CONFIG).read_text())["step"] == 20
    assert (out / F.ADAPTERS).read_bytes() == (run / "ckpt/step-00000020" / F.ADAPTERS
                                               ).read_bytes()
    assert sorted(p.name for p in out.parent.iterdir()) == ["adapters"]  # no temporaries


def test_the_fetched_config_names_the_controllers_model_not_the_nodes_copy(job, run,
                                                                           tmp_path):
    """A rank wrote mlx-lm's ``model``/``data`` keys as its node's copies (what it read);
    mlx-lm's loaders read neither back, a person or a tool on the controller does, to find
    the base model the adapters go with: the controller's directories, as the job gave."""
    config = run / "ckpt" / protocol.checkpoint_name(20) / F.ADAPTER_CONFIG
    config.write_text(json.dumps({"fine_tune_type": "lora", "num_layers": 2, "step": 20,
                                  "model": "/node/data/tiny-0123abcd",
                                  "data": "/node/data/chat-4567"}))
    out = tmp_path / "out"
    with Connector() as connector:
        got = F.fetch(job, connector, out)
    cfg = job.workload.config
    written = json.loads((out / F.ADAPTER_CONFIG).read_text())
    assert written == {"fine_tune_type": "lora", "num_layers": 2, "step": 20,
                       "model": cfg.model.path, "data": cfg.data.path}
    assert got.files[F.ADAPTER_CONFIG] == (out / F.ADAPTER_CONFIG).stat().st_size


def test_only_a_job_that_writes_adapters_has_any_to_fetch(tmp_path):
    from mlxops.jobs.workloads.command import CommandWorkload

    record = JobRecord(name="c", job_file="/j.yml", inventory="/inv.yml", backend="ring",
                       hosts=[], ranks=[], workload=CommandWorkload(("python", "x.py")), job={})
    with pytest.raises(UserError, match="not a fine-tuning job"):
        F.fetch(record, Connector(), tmp_path / "out")


def test_a_failed_fetch_leaves_the_previous_set_whole(job, run, tmp_path):
    out = tmp_path / "out"
    with Connector() as connector:
        F.fetch(job, connector, out)
        before = {p.name: p.read_bytes() for p in out.iterdir()}
        with pytest.raises(F.FetchError, match="no host of job 'ft' has ckpt/step-00000099: "
                                               "a: no complete checkpoint ckpt/step-00000099"):
            F.fetch(job, connector, out, step=99)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in out.parent.iterdir() if p.name.startswith(".")) == []


def test_an_output_directory_holding_other_files_is_refused_before_any_host(job, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")

    class Nowhere:
        def connect(self, host):
            raise AssertionError("no host is asked")

    with pytest.raises(UserError, match="holds notes.txt: fetch replaces the directory"):
        F.fetch(job, Nowhere(), out)
