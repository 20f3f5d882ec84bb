"""``mlxops data prepare`` (mlxops/dataprep/): inputs, tokenizers, shards, the manifest, a
re-run that changes nothing, the memory bound. The corpus is real text a package ships:
CPython's own documentation topics (``pydoc_data.topics``, what ``help('if')`` prints)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from pydoc_data.topics import topics

import numpy as np
import pytest
from click.testing import CliRunner

from mlxops.cli import cli
from mlxops.cli.data import parse_size
from mlxops.dataprep import encoders, inputs, optional
from mlxops.dataprep import prepare as prep
from mlxops.errors import UserError
from mlxops.trainer import shardformat as sf

DOCS = [topics[k] for k in sorted(topics)]


def _jsonl(path: Path, docs=DOCS, field="text") -> Path:
    path.write_text("".join(json.dumps({field: d, "id": i}) + "\n" for i, d in enumerate(docs)))
    return path


def _tokens(out: Path, split: str) -> np.ndarray:
    manifest = sf.read_manifest(out)
    parts = [np.asarray(sf.open_shard(out / s.name)) for s in manifest.shards(split)]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint16)


def _docs_of(tokens: np.ndarray, manifest: sf.Manifest, decode) -> list[str]:
    """Documents back from a split's tokens (each is written after the separator)."""
    sep, out, start = manifest.separator, [], None
    ids = tokens.tolist()
    i = 0
    while i < len(ids):
        if ids[i:i + len(sep)] == sep:
            if start is not None:
                out.append(decode(ids[start:i]))
            i += len(sep)
            start = i
        else:
            i += 1
    if start is not None:
        out.append(decode(ids[start:]))
    return out


def _prepare(tmp_path, *inputs_, **options) -> prep.Report:
    options.setdefault("out", tmp_path / "out")
    return prep.prepare(prep.Options(inputs=tuple(str(i) for i in inputs_), **options))


def test_bytes_of_jsonl_round_trip_with_a_spread_validation_split(tmp_path):
    source = _jsonl(tmp_path / "topics.jsonl")
    report = _prepare(tmp_path, source, val_fraction=0.1, shard_tokens=100_000)
    manifest = report.manifest
    assert (manifest.vocab_size, manifest.dtype, manifest.separator) == (256, "uint16",
                                                                          [10, 10])
    assert [s.name for s in manifest.train] == [f"train-00000{i}.bin" for i in range(5)]
    assert all(s.tokens == 100_000 for s in manifest.train[:-1])

    val = [d for i, d in enumerate(DOCS) if int((i + 1) * 0.1) > int(i * 0.1)]
    train = [d for i, d in enumerate(DOCS) if not int((i + 1) * 0.1) > int(i * 0.1)]
    assert len(val) == 7      # every 10th of the 79 topics, spread over the corpus
    # Each document after the separator (a blank line: bytes have no end-of-text token).
    for split, docs in (("train", train), ("val", val)):
        got = bytes(_tokens(tmp_path / "out", split).tolist())
        assert got == b"".join(b"\n\n" + d.encode() for d in docs), split
    assert manifest.inputs == [sf.SourceInfo(str(source), _sha(source))]


def _sha(path: Path) -> str:
    import hashlib
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_text_paragraphs_are_documents(tmp_path):
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text("one\ntwo\n\n\nthree\n")
    (tmp_path / "corpus" / "b.md").write_text("four é\n")
    (tmp_path / "corpus" / ".hidden").write_text("never read\n")
    report = _prepare(tmp_path, tmp_path / "corpus", val_fraction=0)
    got = bytes(_tokens(tmp_path / "out", "train").tolist())
    assert got == b"\n\none\ntwo\n\nthree\n\nfour \xc3\xa9"
    assert report.manifest.val == []


def test_a_paragraph_longer_than_the_bound_is_cut_at_a_line_end(tmp_path, monkeypatch):
    monkeypatch.setattr(inputs, "MAX_DOCUMENT", 10)
    path = tmp_path / "a.txt"
    path.write_text("aaaa\nbbbb\ncccc\n" + "d" * 25 + "\n")
    docs = [d for d, _ in inputs.documents(inputs.Source(path, inputs.TEXT), "text")]
    assert docs == ["aaaa\nbbbb", "cccc", "d" * 10, "d" * 10, "d" * 5]
    assert sum(r for _, r in inputs.documents(inputs.Source(path, inputs.TEXT), "text")) \
        == path.stat().st_size


def test_parquet_and_a_saved_dataset_read_like_jsonl(tmp_path):
    pa = pytest.importorskip("pyarrow")
    parquet = pytest.importorskip("pyarrow.parquet")
    datasets = pytest.importorskip("datasets")
    table = pa.table({"id": list(range(len(DOCS))), "text": DOCS})
    parquet.write_table(table, tmp_path / "topics.parquet", row_group_size=16)
    datasets.Dataset.from_dict({"text": DOCS}).save_to_disk(str(tmp_path / "saved"))
    dict_dir = tmp_path / "saved-dict"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": DOCS}),
                          "validation": datasets.Dataset.from_dict({"text": ["x"]})}
                         ).save_to_disk(str(dict_dir))
    want = _prepare(tmp_path, _jsonl(tmp_path / "t.jsonl"), out=tmp_path / "j").manifest
    for name, source in (("p", tmp_path / "topics.parquet"), ("d", tmp_path / "saved"),
                         ("dd", dict_dir)):
        got = _prepare(tmp_path, source, out=tmp_path / name).manifest
        assert [s.sha256 for s in got.shards()] == [s.sha256 for s in want.shards()], name
    with pytest.raises(UserError, match=r"--split: no split 'test' in this dataset \(it has "
                                        r"train, validation\)"):
        _prepare(tmp_path, dict_dir, out=tmp_path / "x", split="test")
    with pytest.raises(UserError, match=r"topics.parquet: --field: no column 'body' \(it has "
                                        r"id, text\)"):
        _prepare(tmp_path, tmp_path / "topics.parquet", out=tmp_path / "x", field="body")


def test_bad_jsonl_line_names_file_line_and_field(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text('{"text": "ok"}\n{"body": "no text"}\n')
    with pytest.raises(UserError, match=r"a.jsonl:2: --field: no 'text' string in this line"):
        _prepare(tmp_path, path)
    assert not list((tmp_path / "out").glob("*.bin"))      # no temporary shard left


def test_rerun_over_unchanged_input_changes_nothing(tmp_path):
    source = _jsonl(tmp_path / "topics.jsonl")
    first = _prepare(tmp_path, source, shard_tokens=100_000, val_fraction=0.05)
    out = tmp_path / "out"
    before = {p.name: (p.stat().st_mtime_ns, p.stat().st_ino) for p in out.iterdir()}
    again = _prepare(tmp_path, source, shard_tokens=100_000, val_fraction=0.05)
    assert again.up_to_date and again.manifest == first.manifest
    assert {p.name: (p.stat().st_mtime_ns, p.stat().st_ino) for p in out.iterdir()} == before

    # One document edited near the end: its shard and the manifest are rewritten, the
    # shards before it are recomputed equal and left as they were; a longer shard size
    # leaves fewer shards, and the stale ones go.
    _jsonl(source, DOCS[:-1] + ["the last topic, edited"])
    third = _prepare(tmp_path, source, shard_tokens=100_000, val_fraction=0.05)
    assert not third.up_to_date
    assert third.written == ["train-000004.bin"] and third.deleted == []
    assert third.kept == [f"train-00000{i}.bin" for i in range(4)] + ["val-000000.bin"]
    for name in third.kept:
        assert (out / name).stat().st_mtime_ns == before[name][0]
    fourth = _prepare(tmp_path, source, shard_tokens=300_000, val_fraction=0.05)
    assert fourth.deleted == ["train-000002.bin", "train-000003.bin", "train-000004.bin"]
    assert sorted(p.name for p in out.iterdir()) == [
        "manifest.json", "train-000000.bin", "train-000001.bin", "val-000000.bin"]


def test_trained_bpe_is_deterministic_and_decodes_back(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    source = _jsonl(tmp_path / "topics.jsonl")
    a = _prepare(tmp_path, source, out=tmp_path / "a", train_bpe=1024, val_fraction=0.1)
    b = _prepare(tmp_path, source, out=tmp_path / "b", train_bpe=1024, val_fraction=0.1)
    assert a.manifest.text() == b.manifest.text()
    assert (tmp_path / "a" / "tokenizer.json").read_bytes() == \
        (tmp_path / "b" / "tokenizer.json").read_bytes()
    m = a.manifest
    assert (m.vocab_size, m.dtype, m.tokenizer.kind) == (1024, "uint16", "tokenizer.json")
    tok = tokenizers.Tokenizer.from_file(str(tmp_path / "a" / "tokenizer.json"))
    assert m.separator == [tok.token_to_id("<|endoftext|>")]
    train = [d for i, d in enumerate(DOCS) if not int((i + 1) * 0.1) > int(i * 0.1)]
    got = _docs_of(_tokens(tmp_path / "a", "train"), m, tok.decode)
    assert got == train
    # ~2.9 bytes a token on this text with 1024 tokens: it learned the corpus's words.
    assert m.tokens("train") < 0.4 * sum(len(d.encode()) for d in train)
    again = _prepare(tmp_path, source, out=tmp_path / "a", train_bpe=1024, val_fraction=0.1)
    assert again.up_to_date


def test_a_tokenizer_json_given(tmp_path):
    pytest.importorskip("tokenizers")
    source = _jsonl(tmp_path / "topics.jsonl")
    trained = _prepare(tmp_path, source, out=tmp_path / "a", train_bpe=512).manifest
    given = _prepare(tmp_path, source, out=tmp_path / "b",
                     tokenizer=str(tmp_path / "a")).manifest      # the directory holding it
    assert [s.sha256 for s in given.shards()] == [s.sha256 for s in trained.shards()]
    assert given.tokenizer.sha256 == trained.tokenizer.sha256
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(UserError, match="bad.json: not a tokenizer.json"):
        _prepare(tmp_path, source, out=tmp_path / "c", tokenizer=str(tmp_path / "bad.json"))


def test_tiktoken_file_read_locally(tmp_path, monkeypatch):
    tiktoken_public = pytest.importorskip("tiktoken_ext.openai_public")
    import base64

    # Illustrative: a made-up ranks file in tiktoken's format (each byte its own token, and
    # two merges), read through an encoding constructor that pins no hash. The real
    # cl100k_base.tiktoken is a download, which this machine may not make.
    ranks = {bytes([i]): i for i in range(256)} | {b"th": 256, b"the": 257}
    path = tmp_path / "illustrative_base.tiktoken"
    path.write_text("".join(f"{base64.b64encode(t).decode()} {r}\n" for t, r in ranks.items()))

    def illustrative():
        return {"name": "illustrative_base", "pat_str": tiktoken_public.r50k_pat_str,
                "mergeable_ranks": tiktoken_public.load_tiktoken_bpe("https://x/y.tiktoken"),
                "special_tokens": {"<|endoftext|>": 258}}

    monkeypatch.setitem(tiktoken_public.ENCODING_CONSTRUCTORS, "illustrative_base",
                        illustrative)
    enc = encoders.open_encoder(f"tiktoken:{path}")
    assert (enc.vocab_size, enc.separator, enc.info.name) == (259, [258], "illustrative_base")
    assert enc.encode(["the them"])[0].tolist() == [257, 32, 257, ord("m")]
    # A known encoding's name on a file that is not tiktoken's: refused by its pinned hash.
    wrong = tmp_path / "cl100k_base.tiktoken"
    wrong.write_bytes(path.read_bytes())
    with pytest.raises(UserError, match=r"cl100k_base.tiktoken: --tokenizer: not tiktoken's "
                                        r"cl100k_base \(sha256 [0-9a-f]{12}, tiktoken pins"):
        encoders.open_encoder(f"tiktoken:{wrong}")
    with pytest.raises(UserError, match="name it after one of"):
        encoders.open_encoder(f"tiktoken:{tmp_path / 'mine.tiktoken'}")


def test_a_missing_extra_is_named(monkeypatch):
    real = optional.importlib.import_module

    def refuse(name, *a):
        if name.startswith("tokenizers"):
            raise ImportError(name)
        return real(name, *a)

    monkeypatch.setattr(optional.importlib, "import_module", refuse)
    with pytest.raises(UserError, match=r"^--train-bpe needs the tokenizers package: "
                                        r"pip install 'mlxops\[data\]'$"):
        encoders.train_bpe([], 512, Path("x"))


@pytest.mark.parametrize("argv, message", [
    (["nope.txt"], "nope.txt: no such file or directory"),
    (["{src}", "--max-memory", "lots"], "--max-memory: 'lots': a size such as 512M or 2G"),
    (["{src}", "--max-memory", "10M"], "--max-memory: 10 MiB leaves no room"),
    (["{src}", "--val-fraction", "1"], "--val-fraction: 1.0: a share from 0 to below 1"),
    (["{src}", "--train-bpe", "100"], "--train-bpe: 100: a byte-level BPE needs at least 258"),
])
def test_cli_bad_input_is_one_line_exit_2(tmp_path, argv, message):
    src = _jsonl(tmp_path / "t.jsonl", DOCS[:3])
    argv = [a.format(src=src) for a in argv]
    result = CliRunner().invoke(cli, ["data", "prepare", *argv, "-o", str(tmp_path / "o")])
    assert result.exit_code == 2, result.output
    assert result.output.count("\n") == 1 and message in result.output


def test_cli_json_and_sizes(tmp_path):
    src = _jsonl(tmp_path / "t.jsonl", DOCS[:10])
    result = CliRunner().invoke(cli, ["data", "prepare", str(src), "-o", str(tmp_path / "o"),
                                      "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["written"] == ["train-000000.bin"] and not doc["up_to_date"]
    assert sf.parse_manifest(json.dumps(doc["manifest"])) == sf.read_manifest(tmp_path / "o")
    assert [parse_size(s) for s in ("512M", "2G", "1.5GiB", "4096")] == [
        512 << 20, 2 << 30, 3 << 29, 4096]


def test_the_reader_thread_hands_on_errors_and_stops_when_left():
    def items():
        yield 1
        yield 2
        raise ValueError("unreadable")

    got = []
    with pytest.raises(ValueError, match="unreadable"):
        for item in prep._prefetched(items()):
            got.append(item)
    assert got == [1, 2]

    read = []

    def endless():
        for i in range(10**9):
            read.append(i)
            yield i

    stream = prep._prefetched(endless())
    assert next(stream) == 0
    stream.close()                  # the reader sees the stop and ends: no thread left
    count = len(read)
    time.sleep(0.3)
    assert len(read) == count and count <= 4
