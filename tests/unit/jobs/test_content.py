"""Large files placed on nodes (mlxops/jobs/content.py, mlxops/node/content.py): hash-checked,
only what differs travels, a copy that differs refused. The node here is this machine over
a local connection, its code the checkout (as ``<root>/code`` after a sync)."""

from __future__ import annotations

import hashlib
import io
import os
import sys
from pathlib import Path

import numpy as np
import pytest

import mlxops
from mlxops.jobs import content
from mlxops.node.content import listing
from mlxops.node.protocol import layout
from mlxops.trainer import shardformat as sf
from mlxops.transport import LocalConnection

CHECKOUT = Path(mlxops.__file__).resolve().parent.parent


def _shard(path: Path, tokens: list[int]) -> sf.ShardInfo:
    buf = io.BytesIO()
    buf.write(sf.header(sf.UINT16, len(tokens)))
    sf.write_tokens(buf, np.asarray(tokens), sf.UINT16)
    path.write_bytes(buf.getvalue())
    return sf.ShardInfo(path.name, hashlib.sha256(buf.getvalue()).hexdigest(),
                        len(buf.getvalue()), len(tokens))


def _prepared(directory: Path, shards: int = 3) -> sf.Manifest:
    directory.mkdir(exist_ok=True)
    train = [_shard(directory / sf.shard_name(sf.TRAIN, i), list(range(i, i + 50)))
             for i in range(shards)]
    val = [_shard(directory / sf.shard_name(sf.VAL, 0), [7, 8, 9])]
    manifest = sf.Manifest(tokenizer=sf.TokenizerInfo("bytes", "bytes", "0" * 64),
                           vocab_size=256, dtype=sf.UINT16, train=train, val=val)
    (directory / sf.MANIFEST).write_text(manifest.text())
    return manifest


@pytest.fixture
def node(tmp_path):
    root = tmp_path / "node"
    (root).mkdir()
    (root / layout.CODE_DIR).symlink_to(CHECKOUT)
    return LocalConnection("node1"), sys.executable, str(root)


def test_listing_hashes_once_then_reads_the_cache(tmp_path):
    data = tmp_path / "d"
    data.mkdir()
    (data / "a.bin").write_bytes(b"x" * 1000)
    (data / "sub").mkdir()
    (data / "sub" / "b.bin").write_bytes(b"y")
    cache = tmp_path / "cache.json"
    first = listing(data, cache, ["a.bin", "sub/b.bin"])
    assert first.exists and first.hashed == 2 and first.hashed_bytes == 1001
    assert first.files["a.bin"].sha256 == hashlib.sha256(b"x" * 1000).hexdigest()
    again = listing(data, cache, ["a.bin", "sub/b.bin"])
    assert again.hashed == 0 and again.files == first.files
    # Replaced by a rename (a new inode): hashed again, even with the same size and mtime.
    st = (data / "a.bin").stat()
    (data / "new").write_bytes(b"z" * 1000)
    os.utime(data / "new", ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(data / "new", data / "a.bin")
    third = listing(data, cache, ["a.bin"])
    assert third.hashed == 1
    assert third.files["a.bin"].sha256 == hashlib.sha256(b"z" * 1000).hexdigest()
    assert third.files["sub/b.bin"].sha256 == ""    # listed, not asked to hash


def test_listing_of_a_missing_directory(tmp_path):
    answer = listing(tmp_path / "nope", tmp_path / "c.json", ["x"])
    assert not answer.exists and answer.files == {}


def test_placed_then_only_what_differs_travels(tmp_path, node):
    conn, python, root = node
    data = tmp_path / "prepared"
    manifest = _prepared(data)
    prepared = content.prepared_data(data)
    node_dir = prepared.node_dir(root)
    assert node_dir.startswith(f"{root}/data/prepared-")

    report, problems = content.place(conn, python, root, prepared)
    assert problems == [] and len(report.sent) == 5 and report.bytes_sent > 0
    for name in prepared.files:
        assert (Path(node_dir) / name).read_bytes() == (data / name).read_bytes()

    again, problems = content.place(conn, python, root, prepared)
    assert (again.sent, again.deleted, again.bytes_sent, again.hashed_bytes) == ([], [], 0, 0)

    # Prepared again with one shard changed and one fewer: that shard travels, the stale
    # one goes; the unchanged shards are not hashed again on the node.
    (data / sf.shard_name(sf.TRAIN, 2)).unlink()
    manifest.train = [manifest.train[0], _shard(data / sf.shard_name(sf.TRAIN, 1), [1, 2])]
    (data / sf.MANIFEST).write_text(manifest.text())
    third, problems = content.place(conn, python, root, content.prepared_data(data))
    assert problems == []
    assert third.sent == [sf.MANIFEST, sf.shard_name(sf.TRAIN, 1)]
    assert third.deleted == [sf.shard_name(sf.TRAIN, 2)]
    assert not (Path(node_dir) / sf.shard_name(sf.TRAIN, 2)).exists()


def test_a_node_gets_only_the_files_named_for_it(tmp_path, node):
    conn, python, root = node
    data = tmp_path / "prepared"
    _prepared(data)
    prepared = content.prepared_data(data)
    wanted = [sf.MANIFEST, sf.shard_name(sf.TRAIN, 0), sf.shard_name(sf.VAL, 0)]
    report, problems = content.place(conn, python, root, prepared, wanted)
    assert problems == [] and report.sent == sorted(wanted)
    assert sorted(os.listdir(prepared.node_dir(root))) == sorted(wanted)


def test_a_copy_that_differs_is_refused_in_place(tmp_path, node):
    conn, python, root = node
    data = tmp_path / "prepared"
    _prepared(data)
    mounted = tmp_path / "mounted"
    mounted.mkdir()
    for name in os.listdir(data):
        (mounted / name).write_bytes((data / name).read_bytes())
    shared = content.prepared_data(data, shared=str(mounted))
    report, problems = content.place(conn, python, root, shared)
    assert problems == [] and report.sent == [] and report.node_dir == str(mounted)

    bad = mounted / sf.shard_name(sf.TRAIN, 1)
    bad.write_bytes(bad.read_bytes()[:-2] + b"\xff\xff")     # same size, other tokens
    report, problems = content.place(conn, python, root, shared)
    want = shared.files[bad.name][0][:12]
    assert len(problems) == 1 and problems[0].startswith(f"node1: {mounted} differs from")
    assert f"{bad.name}: sha256 " in problems[0] and f"want {want}" in problems[0]
    assert report.sent == []    # read in place: never written to


def test_missing_shared_path_is_refused(tmp_path, node):
    conn, python, root = node
    data = tmp_path / "prepared"
    _prepared(data)
    shared = content.prepared_data(data, shared=str(tmp_path / "not-mounted"))
    _, problems = content.place(conn, python, root, shared)
    assert problems == [f"node1: {tmp_path}/not-mounted: no such directory (the data of "
                        f"{data})"]


def test_any_directory_is_hashed_once_per_version(tmp_path, monkeypatch):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"w" * 100)
    cache = tmp_path / "hashes.json"
    calls = []
    real = content._sha256
    monkeypatch.setattr(content, "_sha256", lambda p: calls.append(p.name) or real(p))
    first = content.any_directory(model, cache_file=cache)
    assert sorted(calls) == ["config.json", "model.safetensors"]
    assert first.files["model.safetensors"] == (hashlib.sha256(b"w" * 100).hexdigest(), 100)
    calls.clear()
    assert content.any_directory(model, cache_file=cache).files == first.files
    assert calls == []


def test_placing_makes_no_copy_of_the_files_in_temporary_space(tmp_path, node, monkeypatch):
    """The tar is made as it is sent (archive.stream), not spooled per node: with the
    spooled writer out of reach, placement still lands every file whole."""
    from mlxops import archive

    def no_spool(*args, **kwargs):
        raise AssertionError("placement spooled an archive")

    monkeypatch.setattr(archive.tempfile, "SpooledTemporaryFile", no_spool)
    conn, python, root = node
    data = tmp_path / "prepared"
    _prepared(data)
    prepared = content.prepared_data(data)
    report, problems = content.place(conn, python, root, prepared)
    assert problems == [] and report.bytes_sent > sum(s for _, s in prepared.files.values())
    for name in prepared.files:
        assert (Path(prepared.node_dir(root)) / name).read_bytes() == (data / name).read_bytes()


def test_a_streamed_archive_is_the_written_one_and_ends_with_its_reader(tmp_path):
    import io
    import tarfile

    from mlxops import archive

    (tmp_path / "big").write_bytes(os.urandom(3 << 20))
    entries = [archive.Entry("big", tmp_path / "big"), archive.Entry("x", b"small", 0o600)]
    with archive.stream(entries) as streamed:
        data = streamed.read()
        streamed.check()
    assert streamed.sent == len(data)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        got = {m.name: tar.extractfile(m).read() for m in tar}
    assert got == {"big": (tmp_path / "big").read_bytes(), "x": b"small"}
    # A reader that stops early (the command it fed exited) ends the writer: no hang.
    early = archive.stream(entries)
    assert len(early.read(1000)) == 1000
    early.close()
    assert early.error is None
    # A file gone since it was listed: the stream ends early and says why.
    gone = archive.stream([archive.Entry("nope", tmp_path / "nope")])
    gone.read()
    with pytest.raises(FileNotFoundError):
        gone.check()
