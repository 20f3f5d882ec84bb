"""A job's ``data:`` on 2 sandbox nodes: a real corpus prepared with a BPE trained on it,
placed by pre-flight (hash-checked, only what differs travels), a copy that differs refused.

The corpus is text a package ships: CPython's documentation topics (``pydoc_data.topics``,
what ``help('if')`` prints; 79 topics, 465 kB), nothing downloaded. The training run on it
is the trainer's side (its shard reader): it trains on the two nodes, its validation loss
falls, and a rank killed with SIGKILL is recovered by the watchdog to the very losses of a
run never interrupted, read-ahead on (the trainer's own tests hold stop + resume and a
2 -> 1 resume with real ranks: tests/trainer/test_shard_runs.py).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from pydoc_data.topics import topics

import pytest
import yaml
from job_helpers import BackgroundWatchdog, losses, run_dir, wait_for_step
from test_jobs import trainer_pid

from mlxops.devtools.local_ranks import run_ranks
from mlxops.jobs.launch import launch
from mlxops.jobs.placement import place_ranks
from mlxops.jobs.preflight import PreflightError, check_preflight, preflight
from mlxops.jobs.record import load_record
from mlxops.jobs.runfiles import run_files
from mlxops.jobs.selection import select_hosts
from mlxops.jobs.spec import load_job
from mlxops.node.protocol import TRAINER_CONFIG
from mlxops.trainer import shardformat as sf

pytest.importorskip("tokenizers")

HOSTS = "node1,node2"
TRAINER = {"model": {"dims": 32, "layers": 1, "heads": 2, "seq_len": 32},
           "train": {"steps": 10, "global_batch": 4, "micro_batch": 2}}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """The topics as JSONL, prepared with a 1024-token BPE trained on them, in a directory
    the node users can read (for the shared-mount case)."""
    from mlxops.dataprep import prepare as prep

    work = Path(tempfile.mkdtemp(prefix="mlxops-test-data-", dir="/tmp"))
    os.chmod(work, 0o755)
    corpus = work / "topics.jsonl"
    corpus.write_text("".join(json.dumps({"text": topics[k]}) + "\n" for k in sorted(topics)))
    report = prep.prepare(prep.Options(inputs=(str(corpus),), out=work / "prepared",
                                       train_bpe=1024, val_fraction=0.1,
                                       shard_tokens=40_000))
    yield work / "prepared", report.manifest
    shutil.rmtree(work, ignore_errors=True)


def _job(tmp_path: Path, sandbox, name: str, data) -> Path:
    job = {"name": name, "inventory": str(sandbox.inventory_path), "hosts": HOSTS,
           "trainer": TRAINER, "data": data}
    path = tmp_path / f"{name}.yml"
    path.write_text(yaml.safe_dump(job))
    return path


def _seen_here(sandbox, prep, node_path: str) -> Path:
    """A path under a node's root as this machine sees it (the node's home is mounted at
    another path inside its namespace)."""
    return Path(sandbox.node_home(prep.host.name)) / ".mlxops" / Path(node_path).relative_to(
        prep.root)


def _preflight(spec, connector):
    hosts = select_hosts(spec)
    ranks = place_ranks(hosts, spec.base_port)
    results, preps = preflight(spec, hosts, ranks, connector, None)
    results.raise_on_failure("pre-flight")
    return preps, ranks


def test_prepared_corpus_placed_on_two_nodes_only_changes_travel(sandbox, tmp_path,
                                                                 connector, prepared):
    directory, manifest = prepared
    assert manifest.vocab_size == 1024 and len(manifest.train) == 4 and manifest.val
    spec = load_job(_job(tmp_path, sandbox, "t-data", str(directory)))
    assert spec.workload.config.model.vocab_size == 1024  # the manifest's
    files = sorted([sf.MANIFEST, *(s.name for s in manifest.shards())])

    preps, ranks = _preflight(spec, connector)
    check_preflight(spec, preps, ranks, resume=False)
    for node in ("node1", "node2"):
        report = preps[node].data
        assert report.sent == files and report.bytes_sent > sum(s.bytes for s in
                                                                manifest.shards())
        node_dir = _seen_here(sandbox, preps[node], report.node_dir)
        assert node_dir.parent.name == "data" and node_dir.parent.parent.name == ".mlxops"
        for name in files:
            assert (node_dir / name).read_bytes() == (directory / name).read_bytes()
        # Each rank's config reads this node's copy.
        written = run_files(spec, preps[node], ranks, False, None, preps)
        data = json.loads(written[TRAINER_CONFIG])["data"]
        assert data["source"] == sf.SHARDS_SOURCE and data["path"] == report.node_dir
        assert json.loads(written[TRAINER_CONFIG])["model"]["vocab_size"] == 1024

    # Again: nothing travels, and nothing is hashed again (the nodes' caches).
    preps, _ = _preflight(spec, connector)
    assert [(p.data.sent, p.data.bytes_sent, p.data.hashed_bytes)
            for p in preps.values()] == [([], 0, 0), ([], 0, 0)]

    # node2's copy of one shard changed behind mlxops's back (same size): only it goes.
    shard = _seen_here(sandbox, preps["node2"], preps["node2"].data.node_dir) / \
        manifest.train[1].name
    data = bytearray(shard.read_bytes())
    data[2000:2004] = b"\xff\xff\xff\xff"
    shard.write_bytes(bytes(data))
    preps, ranks = _preflight(spec, connector)
    check_preflight(spec, preps, ranks, resume=False)
    assert preps["node1"].data.sent == [] and preps["node2"].data.sent == [shard.name]
    assert shard.read_bytes() == (directory / shard.name).read_bytes()


def test_shared_mount_is_read_in_place_and_a_copy_that_differs_is_refused(
        sandbox, tmp_path, connector, prepared):
    directory, manifest = prepared
    mounted = directory.parent / "mounted"
    shutil.copytree(directory, mounted, dirs_exist_ok=True)
    for path in [mounted, *mounted.iterdir()]:
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    spec = load_job(_job(tmp_path, sandbox, "t-data-shared",
                         {"path": str(directory), "shared": str(mounted)}))
    preps, ranks = _preflight(spec, connector)
    check_preflight(spec, preps, ranks, resume=False)
    assert {n: (p.data.node_dir, p.data.sent) for n, p in preps.items()} == {
        "node1": (str(mounted), []), "node2": (str(mounted), [])}

    bad = mounted / manifest.val[0].name
    data = bytearray(bad.read_bytes())
    data[-2:] = b"\x00\x00" if data[-2:] != b"\x00\x00" else b"\x01\x00"
    bad.write_bytes(bytes(data))
    preps, ranks = _preflight(spec, connector)
    with pytest.raises(PreflightError) as refused:
        check_preflight(spec, preps, ranks, resume=False)
    message = str(refused.value)
    for node in ("node1", "node2"):
        assert f"{node}: {mounted} differs from {directory}: {bad.name}: sha256 " in message
    assert bad.read_bytes() == bytes(data)      # read in place: never written to


def test_the_corpus_trains_on_two_nodes_and_a_killed_rank_recovers_bitwise(
        sandbox, tmp_path, connector, prepared):
    directory, _ = prepared
    name = "t-data-train"
    trainer = {"model": {"dims": 32, "layers": 1, "heads": 2, "seq_len": 32},
               "train": {"steps": 30, "global_batch": 4, "micro_batch": 2, "lr": 3e-3,
                         "warmup": 3, "eval_every": 10, "eval_batches": 2,
                         "checkpoint_every": 10, "keep": 3, "log_every": 1}}
    job = {"name": name, "inventory": str(sandbox.inventory_path), "hosts": HOSTS,
           "trainer": trainer, "data": str(directory), "blas": "off",
           # rank 1 a tenth of a second slower a sequence (a sleep: the numbers are the
           # same): on a quiet machine the run would end before the kill lands
           "env": {"MLXOPS_TRAINER_FAKE_SLOW": "1:0.1"},
           "restart": {"max_restarts": 2, "stall_timeout": 60}}
    (tmp_path / f"{name}.yml").write_text(yaml.safe_dump(job))
    record = launch(load_job(tmp_path / f"{name}.yml"), connector)
    watchdog = BackgroundWatchdog(record, connector)
    wait_for_step(record, connector, 13)
    os.kill(trainer_pid(sandbox, name, 1, "node2"), signal.SIGKILL)
    final = watchdog.result(timeout=300)
    assert final.state == "finished", final.to_dict()
    assert [r.reason.split(":")[0] for r in load_record(name).restarts] == [
        "rank 1 on node2 exited with code 137"]
    node1 = run_dir(sandbox, "node1", name)
    metrics = [json.loads(x) for x in (node1 / "metrics.jsonl").read_text().splitlines()]
    val = {m["step"]: m["val_loss"] for m in metrics if m.get("val_loss") is not None}
    assert sorted(val) == [10, 20, 30] and val[30] < val[10]
    assert (node1 / "best" / "latest").exists()
    assert final.validation and final.validation.startswith("validation loss ")

    # The same ranks' config run straight through on this machine, reading the
    # controller's copy of the corpus: every loss equal, bit for bit.
    config = json.loads((node1 / TRAINER_CONFIG).read_text())
    assert config["data"]["source"] == "shards" and config["data"]["prefetch"] == 2
    config["data"]["path"] = str(directory)
    config["out"] = str(tmp_path / "straight")
    (tmp_path / "straight.json").write_text(json.dumps(config))
    root = Path(__file__).resolve().parents[2]
    done = run_ranks([sys.executable, "-m", "mlxops.trainer", "--config",
                      str(tmp_path / "straight.json")], 2,
                     env={**os.environ, "PYTHONPATH": str(root)}, cwd=root, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    straight = {}
    for line in (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        straight[rec["step"]] = rec["loss"]
    assert losses(sandbox, name) == straight
