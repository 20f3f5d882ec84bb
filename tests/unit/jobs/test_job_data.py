"""A job's ``data:`` (mlxops/jobs/data.py): the manifest read when the job loads, its
vocabulary given to the trainer, what mlxops sets refused, and each rank reading the
node's copy."""

from __future__ import annotations

import json

import pytest
import yaml

from mlxops.dataprep import prepare as prep
from mlxops.errors import UserError
from mlxops.jobs.data import DataSpec, files_for_node, rank_data
from mlxops.jobs.record import launched_job
from mlxops.jobs.spec import JobSpec, load_job
from mlxops.trainer import shardformat as sf

INVENTORY = {"all": {"hosts": {"a": {"ansible_host": "10.0.0.1"}}}}
TRAINER = {"model": {"dims": 32, "layers": 1, "heads": 2, "seq_len": 16},
           "train": {"steps": 10}}


@pytest.fixture
def prepared(tmp_path):
    (tmp_path / "corpus.txt").write_text("a short corpus\n\nof two paragraphs\n" * 20)
    prep.prepare(prep.Options(inputs=(str(tmp_path / "corpus.txt"),),
                              out=tmp_path / "prepared", val_fraction=0.2))
    return tmp_path / "prepared"


def _job(tmp_path, data, trainer=None, **more) -> JobSpec:
    (tmp_path / "inv.yml").write_text(yaml.safe_dump(INVENTORY))
    job = {"name": "corpus", "inventory": "inv.yml", "data": data, **more}
    if "command" not in more:
        job["trainer"] = trainer or TRAINER
    (tmp_path / "job.yml").write_text(yaml.safe_dump(job))
    return load_job(tmp_path / "job.yml")


def test_data_gives_the_trainer_the_manifests_vocabulary(tmp_path, prepared):
    manifest = sf.read_manifest(prepared)
    # A manifest of another vocabulary (as a trained BPE gives): the model takes it.
    manifest.vocab_size = 1024
    (prepared / sf.MANIFEST).write_text(manifest.text())
    spec = _job(tmp_path, "prepared")
    assert spec.data == DataSpec(prepared.resolve(), None)
    assert spec.workload.config.model.vocab_size == 1024
    assert set(spec.data.content().files) == set(files_for_node(manifest)) == {
        "manifest.json", "train-000000.bin", "val-000000.bin"}
    # The job record keeps it, and gives the same job back.
    doc = json.loads(json.dumps(launched_job(spec)))
    assert doc["data"] == {"path": str(prepared.resolve()), "shared": None}
    assert DataSpec.from_dict(doc["data"]) == spec.data


def test_shared_path(tmp_path, prepared):
    assert _job(tmp_path, {"path": "prepared", "shared": True}).data.shared == \
        str(prepared.resolve())
    spec = _job(tmp_path, {"path": "prepared", "shared": "/Volumes/corpus"})
    assert spec.data.content().node_dir("/home/u/.mlxops") == "/Volumes/corpus"
    assert spec.data.content().shared == "/Volumes/corpus"


@pytest.mark.parametrize("data, trainer, more, message", [
    ("nope", None, {}, r"job.yml: data: .*nope/manifest.json: No such file or directory "
                       r"\(prepare it with 'mlxops data prepare'\)"),
    ({"path": "prepared", "mounted": True}, None, {},
     r"job.yml: data.mounted: unknown key \(known: path, shared\)"),
    ({"shared": True}, None, {}, "job.yml: data.path: required"),
    ({"path": "prepared", "shared": "rel/dir"}, None, {},
     "job.yml: data.shared: must be true .* got 'rel/dir'"),
    ("prepared", {**TRAINER, "model": {**TRAINER["model"], "vocab_size": 512}}, {},
     r"job.yml: trainer.model.vocab_size: 512, but the tokenizer of .*prepared has 256 "
     "tokens"),
    ("prepared", {**TRAINER, "data": {"source": "text", "path": "x"}}, {},
     "job.yml: trainer.data.source: is set by mlxops from 'data:'"),
    ("prepared", None, {"command": ["python", "train.py"]},
     "job.yml: data: goes with 'trainer:'"),
])
def test_bad_data_is_one_line_naming_the_key(tmp_path, prepared, data, trainer, more,
                                             message):
    with pytest.raises(UserError, match=message):
        _job(tmp_path, data, trainer, **more)


def test_a_vocabulary_given_equal_is_fine(tmp_path, prepared):
    trainer = {**TRAINER, "model": {**TRAINER["model"], "vocab_size": 256}}
    assert _job(tmp_path, "prepared", trainer).workload.config.model.vocab_size == 256


def test_each_rank_reads_its_nodes_copy():
    config = {"data": {"seed": 3, "source": "synthetic", "path": None}, "out": "/r"}
    got = rank_data(config, "/home/u/.mlxops/data/prepared-1a2b3c4d")
    assert got["data"] == {"seed": 3, "source": sf.SHARDS_SOURCE,
                           "path": "/home/u/.mlxops/data/prepared-1a2b3c4d"}
    assert config["data"]["source"] == "synthetic"      # a copy
