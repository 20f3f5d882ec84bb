"""The documents of ``mlxops data prepare``'s inputs, streamed: never a whole file in memory.

An input is a file or a directory, its kind by what it is:

* ``datasets`` — a directory ``datasets.save_to_disk`` wrote: ``state.json`` (one dataset)
  or ``dataset_dict.json`` (splits; ``--split`` picks one, ``train`` by default). Its
  Arrow files are read record batch by record batch with pyarrow, which is what they are:
  neither ``datasets`` nor its cache is needed;
* ``parquet`` — ``*.parquet``, read a batch of rows at a time (pyarrow decodes a row
  group's column at once: the memory bound holds for row groups smaller than it);
* ``jsonl`` — ``*.jsonl`` / ``*.json`` with one object per line; each line a document, its
  ``--field`` (``text``) a string;
* ``text`` — any other file: each paragraph (lines up to a blank line) a document. A
  paragraph longer than the document bound is cut at a line end, a line longer than it at
  the bound. Read a MiB at a time (a character split between two reads is kept whole by
  the incremental UTF-8 decoder) and cut at blank lines with one regular expression.

A directory that is no dataset is every file under it, sorted, hidden ones left out, each
by its suffix. Documents come out in input order, each with the bytes of the input it
consumed, for the progress bar.
"""

from __future__ import annotations

import codecs
import json
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from mlxops.dataprep.optional import need
from mlxops.errors import UserError, bad_input

TEXT, JSONL, PARQUET, DATASETS = "text", "jsonl", "parquet", "datasets"
SUFFIXES = {".jsonl": JSONL, ".json": JSONL, ".parquet": PARQUET}
STATE, DATASET_DICT = "state.json", "dataset_dict.json"
#: A text document longer than this many characters is cut (at a line end where it can be).
MAX_DOCUMENT = 4 << 20
_READ = 1 << 20
#: A blank line (or several): spaces and tabs only between two line ends.
_BLANK_LINE = re.compile(r"\n(?:[ \t\r\f\v]*\n)+")


@dataclass(frozen=True)
class Source:
    """One file to read and its kind."""

    path: Path
    kind: str


@dataclass(frozen=True)
class Input:
    """An input as the user gave it, and the files it is read from, in order."""

    given: str
    sources: tuple[Source, ...]

    @property
    def size(self) -> int:
        return sum(s.path.stat().st_size for s in self.sources)


def resolve(given: Sequence[str], split: str = "train") -> list[Input]:
    """The inputs' files; a UserError naming the input when one is missing or empty."""
    out = []
    for word in given:
        path = Path(word)
        if path.is_file():
            sources: list[Source] = [Source(path, SUFFIXES.get(path.suffix.lower(), TEXT))]
        elif path.is_dir():
            sources = _dataset(path, split, word) or _tree(path)
        else:
            raise bad_input(word, None, "no such file or directory")
        if not sources:
            raise bad_input(word, None, "no files in it")
        out.append(Input(word, tuple(sources)))
    return out


def _tree(directory: Path) -> list[Source]:
    found = []
    for dirpath, dirnames, filenames in os.walk(directory):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if not name.startswith("."):
                path = Path(dirpath) / name
                found.append(Source(path, SUFFIXES.get(path.suffix.lower(), TEXT)))
    return found


def _dataset(directory: Path, split: str, given: str) -> list[Source]:
    """The Arrow files of a ``save_to_disk`` directory; [] when it is not one."""
    if (directory / DATASET_DICT).is_file():
        try:
            splits = json.loads((directory / DATASET_DICT).read_text())["splits"]
        except (OSError, ValueError, KeyError, TypeError):
            raise bad_input(directory / DATASET_DICT, "splits", "unreadable") from None
        if split not in splits:
            raise bad_input(given, "--split", f"no split {split!r} in this dataset (it has "
                                              f"{', '.join(map(str, splits))})")
        return _dataset(directory / split, split, given)
    if not (directory / STATE).is_file():
        return []
    try:
        state = json.loads((directory / STATE).read_text())
        files = [directory / f["filename"] for f in state["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError):
        raise bad_input(directory / STATE, "_data_files", "unreadable") from None
    if state.get("_indices") or (directory / "indices.arrow").exists():
        raise bad_input(given, None, "a dataset saved with an indices mapping: save it "
                                     "after .flatten_indices()")
    return [Source(f, DATASETS) for f in files]


# --- documents ------------------------------------------------------------------------------


def documents(source: Source, field: str) -> Iterator[tuple[str | None, int]]:
    """(document, input bytes read since the last one) of one file; a None document says
    only how much was read (what follows the last document)."""
    readers = {TEXT: _text, JSONL: _jsonl, PARQUET: _parquet, DATASETS: _arrow}
    yield from readers[source.kind](source.path, field)


def _text(path: Path, field: str) -> Iterator[tuple[str | None, int]]:
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    rest, pending = "", 0
    with open(path, "rb") as fh:
        while True:
            raw = fh.read(_READ)
            pending += len(raw)
            rest += decoder.decode(raw, final=not raw)
            pieces = _BLANK_LINE.split(rest)
            # The last piece may go on in the next read, unless the file ended.
            rest = pieces.pop() if raw else ""
            for piece in pieces:
                for doc in _cut(piece):
                    yield doc, pending
                    pending = 0
            while len(rest) > MAX_DOCUMENT:         # no blank line for that long
                doc, rest = _cut_one(rest)
                if doc.strip():
                    yield doc, pending
                    pending = 0
            if not raw:
                break
    if pending:
        yield None, pending     # blank lines after the last document: progress only


def _cut(piece: str) -> Iterator[str]:
    """A paragraph as documents of at most :data:`MAX_DOCUMENT` characters."""
    while len(piece) > MAX_DOCUMENT:
        doc, piece = _cut_one(piece)
        if doc.strip():
            yield doc
    piece = piece.rstrip("\n")
    if piece.strip():
        yield piece


def _cut_one(text: str) -> tuple[str, str]:
    """The first document of a text too long for one: up to the last line end within the
    bound, else the bound itself."""
    end = text.rfind("\n", 0, MAX_DOCUMENT)
    if end < 0:
        return text[:MAX_DOCUMENT], text[MAX_DOCUMENT:]
    return text[:end], text[end + 1:]


def _jsonl(path: Path, field: str) -> Iterator[tuple[str, int]]:
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            try:
                text = json.loads(raw)[field]
            except (ValueError, KeyError, TypeError):
                text = None
            if not isinstance(text, str):
                raise bad_input(f"{path}:{number}", "--field", f"no {field!r} string in this "
                                                               "line")
            yield text, len(raw)


def _column_strings(column, path: Path, field: str) -> list[str]:
    values = column.to_pylist()
    for value in values:
        if value is not None and not isinstance(value, str):
            raise bad_input(path, "--field", f"{field!r} holds {type(value).__name__}, not "
                                             "text")
    return [v for v in values if v is not None]


def _parquet(path: Path, field: str) -> Iterator[tuple[str, int]]:
    parquet = need("pyarrow.parquet", "a Parquet input")
    try:
        handle = parquet.ParquetFile(path)
    except Exception as exc:  # noqa: BLE001 - pyarrow's errors have no common base
        raise bad_input(path, None, f"not a Parquet file: {exc}") from None
    if field not in handle.schema_arrow.names:
        raise bad_input(path, "--field", f"no column {field!r} (it has "
                                         f"{', '.join(handle.schema_arrow.names)})")
    rows, size = max(1, handle.metadata.num_rows), path.stat().st_size
    done = 0
    for batch in handle.iter_batches(batch_size=1024, columns=[field]):
        texts = _column_strings(batch.column(0), path, field)
        before, done = done, done + batch.num_rows
        share = size * done // rows - size * before // rows
        for i, text in enumerate(texts):
            yield text, share if i == 0 else 0


def _arrow(path: Path, field: str) -> Iterator[tuple[str, int]]:
    pa = need("pyarrow", "a datasets.save_to_disk input")
    with pa.memory_map(str(path)) as mapped:
        try:
            reader = pa.ipc.open_stream(mapped)
        except pa.ArrowInvalid as exc:
            raise bad_input(path, None, f"not an Arrow stream: {exc}") from None
        if field not in reader.schema.names:
            raise bad_input(path, "--field", f"no column {field!r} (it has "
                                             f"{', '.join(reader.schema.names)})")
        index, at = reader.schema.get_field_index(field), 0
        for batch in reader:
            texts = _column_strings(batch.column(index), path, field)
            now = mapped.tell()
            for i, text in enumerate(texts):
                yield text, now - at if i == 0 else 0
            at = now


def batches(inputs: Sequence[Input], field: str, batch_bytes: int
            ) -> Iterator[tuple[list[str], int]]:
    """Documents in order, gathered into lists of at most ``batch_bytes`` of text (one
    longer document alone), each with the input bytes it consumed."""
    batch: list[str] = []
    size = consumed = 0
    for item in inputs:
        for source in item.sources:
            for text, read in documents(source, field):
                consumed += read
                if text is None:
                    continue
                if batch and size + len(text) > batch_bytes:
                    yield batch, consumed - read
                    batch, size, consumed = [], 0, read
                batch.append(text)
                size += len(text)
    if batch or consumed:
        yield batch, consumed


def check_inputs(inputs: Sequence[Input]) -> None:
    """Refuse, before any work, an input whose reader needs a missing package."""
    for item in inputs:
        kinds = {s.kind for s in item.sources}
        if kinds & {PARQUET, DATASETS}:
            need("pyarrow", f"{item.given} (Parquet or a saved dataset)")
        if not all(os.access(s.path, os.R_OK) for s in item.sources):
            raise UserError(f"{item.given}: a file in it is not readable")
