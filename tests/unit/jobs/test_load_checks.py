"""What a job needs known is checked when it loads, on the controller, before any host is
touched (one line naming the file and the key, exit 2): the corpus's vocabulary (and its
default), the sequence length against the shards, a fine-tuning method's layers against
the model's ``config.json``. Each of these the ranks refused only after they started."""

from __future__ import annotations

import json

import pytest
import yaml

from mlxops.dataprep import prepare as prep
from mlxops.errors import UserError
from mlxops.jobs.spec import load_job
from mlxops.trainer import shardformat as sf

INVENTORY = {"all": {"hosts": {"a": {"ansible_host": "10.0.0.1"}}}}


@pytest.fixture
def corpus(tmp_path):
    """A prepared corpus (bytes), its manifest then saying another vocabulary, as a BPE
    trained by ``data prepare --train-bpe 512`` would."""
    (tmp_path / "corpus.txt").write_text("a short corpus\n\nof two paragraphs\n" * 20)
    prep.prepare(prep.Options(inputs=(str(tmp_path / "corpus.txt"),),
                              out=tmp_path / "prepared", val_fraction=0.2))
    manifest = sf.read_manifest(tmp_path / "prepared")
    manifest.vocab_size = 512
    (tmp_path / "prepared" / sf.MANIFEST).write_text(manifest.text())
    return tmp_path / "prepared"


def job(tmp_path, **body):
    (tmp_path / "inv.yml").write_text(yaml.safe_dump(INVENTORY))
    path = tmp_path / "job.yml"
    path.write_text(yaml.safe_dump({"name": "j", "inventory": "inv.yml", **body}))
    return path


def trainer(seq_len=16, vocab=None, **train):
    model = {"dims": 32, "layers": 1, "heads": 2, "seq_len": seq_len}
    if vocab is not None:
        model["vocab_size"] = vocab
    return {"model": model, "train": {"steps": 10, **train}}


def test_the_corpus_vocabulary_is_the_default_and_another_is_refused(tmp_path, corpus):
    # the job's data: (placed by mlxops) ...
    assert load_job(job(tmp_path, trainer=trainer(), data="prepared")
                    ).workload.config.model.vocab_size == 512
    # ... and the trainer's own shards source at a path the controller reads too
    shards = {**trainer(), "data": {"source": "shards", "path": str(corpus)}}
    assert load_job(job(tmp_path, trainer=shards)).workload.config.model.vocab_size == 512
    path = job(tmp_path, trainer={**shards, "model": {**shards["model"], "vocab_size": 256}})
    with pytest.raises(UserError) as err:
        load_job(path)
    assert str(err.value) == (f"{path}: trainer.model.vocab_size: 256, but the corpus at "
                              f"{corpus} was tokenized with a vocabulary of 512 (leave it "
                              "out: it is taken from its manifest.json)")


def test_a_shards_path_the_controller_cannot_read_is_left_to_the_ranks(tmp_path):
    shards = {**trainer(), "data": {"source": "shards", "path": "/nodes/only/corpus"}}
    assert load_job(job(tmp_path, trainer=shards)).workload.config.model.vocab_size == 256


def test_a_sequence_longer_than_every_shard_is_refused(tmp_path, corpus):
    train_tokens = sf.read_manifest(corpus).tokens(sf.TRAIN)
    path = job(tmp_path, trainer=trainer(seq_len=4096), data="prepared")
    with pytest.raises(UserError) as err:
        load_job(path)
    assert str(err.value) == (f"{path}: trainer.model.seq_len: 4096, but the training split "
                              f"of the corpus (data) has {train_tokens} tokens: no shard "
                              "holds seq_len + 1 of them (a smaller seq_len, or more data)")


def test_validation_needs_a_window_of_the_validation_split(tmp_path, corpus):
    manifest = sf.read_manifest(corpus)
    val, train = manifest.tokens(sf.VAL), manifest.tokens(sf.TRAIN)
    seq = val + 1                           # a window of the training split, none of val's
    assert max(s.tokens for s in manifest.shards(sf.TRAIN)) > seq
    load_job(job(tmp_path, trainer=trainer(seq_len=seq), data="prepared"))
    path = job(tmp_path, trainer=trainer(seq_len=seq, eval_every=5), data="prepared")
    with pytest.raises(UserError, match=rf"trainer\.model\.seq_len: {seq}, but the validation "
                                        rf"split of the corpus \(data\) has {val} tokens"):
        load_job(path)
    assert train > val


def finetune(tmp_path, layers, **method):
    model, data = tmp_path / "model", tmp_path / "chat"
    model.mkdir(exist_ok=True)
    data.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps({"num_hidden_layers": layers}))
    (data / "train.jsonl").write_text("")
    (data / "valid.jsonl").write_text("")
    section = {"model": {"path": "model"}, "data": {"path": "chat"}}
    if method:
        section["method"] = method
    return job(tmp_path, finetune=section)


def test_lora_on_a_small_model_adapts_all_its_blocks_by_default(tmp_path):
    # mlx-lm's default is the last 16 blocks; a 2-block model has 2.
    assert load_job(finetune(tmp_path, 2)).workload.config.method.num_layers == 2
    assert load_job(finetune(tmp_path, 40)).workload.config.method.num_layers == 16
    assert load_job(finetune(tmp_path, 2, num_layers=-1)).workload.config.method.num_layers == -1


def test_more_layers_than_the_model_has_are_refused_with_both_numbers(tmp_path):
    path = finetune(tmp_path, 2, type="dora", num_layers=16)
    with pytest.raises(UserError) as err:
        load_job(path)
    assert str(err.value) == (f"{path}: finetune.method.num_layers: 16, but the model at "
                              f"{tmp_path / 'model'} has 2 blocks (num_hidden_layers in its "
                              "config.json): at most 2, or -1 for all")
    assert load_job(finetune(tmp_path, 2, num_layers=2)).workload.config.method.num_layers == 2
