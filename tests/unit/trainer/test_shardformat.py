"""The token-shard format and its manifest (mlxops/trainer/shardformat.py)."""

from __future__ import annotations

import hashlib
import io
import json

import numpy as np
import pytest

from mlxops.trainer import shardformat as sf


def _write(path, tokens, dtype):
    buf = io.BytesIO()
    buf.write(sf.header(dtype, len(tokens)))
    sf.write_tokens(buf, np.asarray(tokens), dtype)
    path.write_bytes(buf.getvalue())
    return buf.getvalue()


def test_uint16_shard_is_what_llm_c_and_modded_nanogpt_read(tmp_path):
    # Their reader, as modded-nanogpt's _load_data_shard and llm.c's dataloader do it:
    # 256 int32, magic 20240520, version 1, count; then `count` uint16 tokens.
    data = _write(tmp_path / "a.bin", [1, 2, 65535, 0], sf.UINT16)
    head = np.frombuffer(data[:1024], dtype=np.int32)
    assert (head[0], head[1], head[2]) == (20240520, 1, 4)
    assert not head[3:].any()
    assert len(data) == 1024 + 2 * 4
    assert np.frombuffer(data[1024:], dtype=np.uint16).tolist() == [1, 2, 65535, 0]
    assert sf.open_shard(tmp_path / "a.bin").tolist() == [1, 2, 65535, 0]


def test_uint32_shard_for_a_large_vocabulary(tmp_path):
    assert sf.dtype_for(65536) == sf.UINT16
    assert sf.dtype_for(65537) == sf.UINT32
    data = _write(tmp_path / "b.bin", [70000, 3], sf.UINT32)
    head = np.frombuffer(data[:12], dtype=np.int32).tolist()
    assert head == [20240801, 7, 2]     # llm.c's LLaMA-3 shards
    shard = sf.open_shard(tmp_path / "b.bin")
    assert shard.dtype == np.dtype("<u4") and shard.tolist() == [70000, 3]


def test_an_id_the_dtype_cannot_hold_is_refused():
    with pytest.raises(sf.ShardError, match="does not fit in uint16"):
        sf.write_tokens(io.BytesIO(), np.array([65536]), sf.UINT16)


def test_a_shard_cut_short_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "c.bin"
    data = _write(path, list(range(10)), sf.UINT16)
    path.write_bytes(data[:-2])
    with pytest.raises(sf.ShardError, match=r"c\.bin: 1042 bytes, but its header says 10 "
                                            "uint16 tokens"):
        sf.open_shard(path)


@pytest.mark.parametrize("data, problem", [
    (b"short", "shorter than a shard's 1024-byte header"),
    (b"\x01" * 1024, "not a token shard"),
])
def test_what_is_not_a_shard(tmp_path, data, problem):
    path = tmp_path / "x.bin"
    path.write_bytes(data)
    with pytest.raises(sf.ShardError, match=problem):
        sf.open_shard(path)


def test_empty_shard_reads_as_no_tokens(tmp_path):
    _write(tmp_path / "e.bin", [], sf.UINT16)
    assert sf.open_shard(tmp_path / "e.bin").size == 0


def _manifest(**changes) -> sf.Manifest:
    shard = sf.ShardInfo(sf.shard_name(sf.TRAIN, 0), "a" * 64, 1030, 3)
    fields = dict(tokenizer=sf.TokenizerInfo("bytes", "bytes", "b" * 64), vocab_size=256,
                  dtype=sf.UINT16, train=[shard],
                  val=[sf.ShardInfo(sf.shard_name(sf.VAL, 0), "c" * 64, 1026, 1)],
                  separator=[10], inputs=[sf.SourceInfo("corpus.txt", "d" * 64)],
                  options={"shard_tokens": 100})
    fields.update(changes)
    return sf.Manifest(**fields)


def test_manifest_round_trips_and_is_stable_bytes():
    manifest = _manifest()
    text = manifest.text()
    assert sf.parse_manifest(text) == manifest
    assert sf.parse_manifest(text).text() == text
    assert manifest.tokens(sf.TRAIN) == 3 and manifest.tokens(sf.VAL) == 1
    assert [s.name for s in manifest.shards()] == ["train-000000.bin", "val-000000.bin"]


@pytest.mark.parametrize("changes, problem", [
    ({"dtype": "int8"}, "dtype: 'int8'"),
    ({"vocab_size": 100000}, "vocab_size 100000 does not fit in uint16"),
    ({"train": []}, "no training shard"),
    ({"format": 9}, "manifest format 9"),
    ({"val": [sf.ShardInfo("../x.bin", "c", 1, 1)]}, "a plain file name"),
])
def test_manifest_rules(changes, problem):
    with pytest.raises(sf.ShardError, match=problem):
        sf.parse_manifest(_manifest(**changes).text(), "data/manifest.json")


def test_manifest_of_another_shape_names_the_field(tmp_path):
    doc = json.loads(_manifest().text())
    doc["train"][0]["tokens"] = "many"
    (tmp_path / sf.MANIFEST).write_text(json.dumps(doc))
    with pytest.raises(sf.ShardError, match=r"manifest.json: not a token-shard manifest: "
                                            r"Manifest.train\[0\].tokens: want int"):
        sf.read_manifest(tmp_path)


def test_missing_manifest_says_how_to_make_one(tmp_path):
    with pytest.raises(sf.ShardError, match="mlxops data prepare"):
        sf.read_manifest(tmp_path)


def test_shard_hash_covers_the_header(tmp_path):
    a = _write(tmp_path / "a.bin", [1, 2], sf.UINT16)
    b = _write(tmp_path / "b.bin", [1, 2], sf.UINT32)
    assert hashlib.sha256(a).hexdigest() != hashlib.sha256(b).hexdigest()
