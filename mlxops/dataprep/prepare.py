"""``mlxops data prepare``: inputs tokenized into token shards and a manifest, streaming.

The policy:

* **Deterministic.** Documents are read in input order, each written after the
  tokenizer's separator; document ``i`` goes to the validation split when
  ``floor((i+1) * f) > floor(i * f)`` (``f``: ``--val-fraction``), so every ``1/f``-th
  document is held out, spread over the corpus, and no randomness is involved. A split's
  shards roll over every ``--shard-tokens`` tokens (a document may straddle two). The same
  inputs, tokenizer and options give the same bytes, a trained BPE included.
* **Nothing rewritten that is equal.** The inputs are hashed first (content, not mtime);
  when the manifest in ``-o`` was made from the same input hashes, options and tokenizer,
  and its shards are all there, nothing is done. Otherwise every shard is written under a
  temporary name, hashed, and replaces the old one only when it differs; shards no longer
  listed go; the manifest is written last, and only when it changed.
* **Bounded memory.** Documents are tokenized in batches whose text is at most
  ``(max_memory - what the process holds at the start - a reserve for reading) / factor``
  bytes, ``factor`` being
  what a byte of text costs while its tokens are made (the tokenizer's objects, id lists,
  arrays, and the next batch a reader thread prepares meanwhile: :data:`BYTES_PER_TEXT_BYTE`);
  tokens go to the shard files as they come. So a
  corpus larger than the memory works, and ``--max-memory`` bounds the process's peak RSS
  (the tests hold it to that on a corpus larger than the bound, with the bytes tokenizer
  and with a tokenizer.json). Training a BPE keeps the
  tokenizers library's counts of distinct words, which grow with the vocabulary of the
  corpus, not its size.
"""

from __future__ import annotations

import hashlib
import queue
import resource
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import numpy as np

from mlxops.dataprep import encoders, inputs
from mlxops.dataprep.writer import TMP_PREFIX, ShardWriter, file_sha256
from mlxops.errors import UserError
from mlxops.trainer import shardformat as sf

#: Peak bytes per byte of text in a batch while it is tokenized, measured with each kind
#: (tests/unit/dataprep/test_dataprep.py holds the bound): a tokenizer.json's encodings keep token
#: strings and offsets per token; tiktoken and bytes keep the ids only.
BYTES_PER_TEXT_BYTE = {encoders.BYTES: 20, encoders.TOKENIZER_JSON: 80, encoders.TIKTOKEN: 24}
#: What reading takes besides the batches, whatever their size: a MiB read, decoded (up to
#: 4 bytes a character) and cut into paragraphs (measured: ~8 MiB).
READ_RESERVE = 12 << 20
#: What a kind of tokenizer takes besides its batches, whatever their size: the tokenizers
#: library's threads and their allocations (measured with a tokenizer.json, 12 MiB of text
#: at three bounds: 18 MiB above the start and the reader's reserve, then 80 bytes a byte
#: of batch; over a 96 MiB corpus the peak crept 20 MiB past an 88 MiB bound without it).
KIND_RESERVE = {encoders.BYTES: 0, encoders.TOKENIZER_JSON: 24 << 20, encoders.TIKTOKEN: 0}
MIN_BATCH = 64 << 10
#: Larger batches would only cost memory: the tokenizer's threads are busy with a few MiB.
MAX_BATCH = 8 << 20
TRAINED = "tokenizer.json"

T = TypeVar("T")
Progress = Callable[[str, int, int], None]   # (stage, bytes done in it, its total)


@dataclass(frozen=True)
class Options:
    inputs: tuple[str, ...]
    out: Path
    tokenizer: str = encoders.BYTES
    train_bpe: int | None = None
    field: str = "text"
    split: str = "train"
    val_fraction: float = 0.01
    shard_tokens: int = 100_000_000
    max_memory: int = 2 << 30

    def recorded(self) -> dict[str, object]:
        """What the manifest keeps of them: what changes the output."""
        return {"field": self.field, "split": self.split, "val_fraction": self.val_fraction,
                "shard_tokens": self.shard_tokens, "train_bpe": self.train_bpe}


@dataclass
class Report:
    manifest: sf.Manifest
    up_to_date: bool = False
    written: list[str] = field(default_factory=list)   # shards new or changed
    kept: list[str] = field(default_factory=list)      # rewritten equal: left as they were
    deleted: list[str] = field(default_factory=list)
    input_bytes: int = 0
    seconds: float = 0.0
    peak_memory: int = 0                                # the process's peak RSS, bytes


def peak_rss() -> int:
    """This process's peak resident memory, in bytes.

    Linux: ``VmHWM`` of ``/proc/self/status``, the peak of this program's own memory;
    ``ru_maxrss`` would not do there, as it keeps the peak of the process before ``exec``
    (a large parent's, copied at ``fork``). macOS: ``ru_maxrss`` (bytes there)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def _no_progress(stage: str, done: int, total: int) -> None:
    pass


def prepare(options: Options, progress: Progress = _no_progress) -> Report:
    start = time.monotonic()
    check_options(options)
    found = inputs.resolve(options.inputs, options.split)
    inputs.check_inputs(found)
    _refuse_output_inside(options.out, found)
    total = sum(i.size for i in found)
    sources = _hash_inputs(found, total, progress)
    options.out.mkdir(parents=True, exist_ok=True)
    old = _old_manifest(options.out)
    trained = options.out / TRAINED
    encoder: encoders.Encoder | None = None
    if options.train_bpe is None:
        encoder = encoders.open_encoder(options.tokenizer)
    if old is not None and _up_to_date(old, options, sources, encoder, trained):
        return Report(old, up_to_date=True, input_bytes=total,
                      seconds=time.monotonic() - start, peak_memory=peak_rss())
    batch_bytes = _batch_bytes(options, encoder)
    if encoder is None:
        assert options.train_bpe is not None
        encoder = encoders.train_bpe(_texts(found, options, batch_bytes, total, progress,
                                            "training BPE"), options.train_bpe, trained)
    report = _write(found, options, encoder, sources, old, batch_bytes, total, progress)
    report.seconds, report.peak_memory = time.monotonic() - start, peak_rss()
    return report


def check_options(options: Options) -> None:
    if not 0 <= options.val_fraction < 1:
        raise UserError(f"--val-fraction: {options.val_fraction}: a share from 0 to below 1")
    if options.shard_tokens < 1 or options.shard_tokens >= 1 << 31:
        raise UserError(f"--shard-tokens: {options.shard_tokens}: from 1 to 2**31-1")
    if options.train_bpe is not None and options.tokenizer != encoders.BYTES:
        raise UserError("--train-bpe trains the tokenizer: leave --tokenizer out")


def _refuse_output_inside(out: Path, found: Sequence[inputs.Input]) -> None:
    target = out.resolve()
    for item in found:
        given = Path(item.given).resolve()
        if given.is_dir() and (target == given or given in target.parents):
            raise UserError(f"-o {out}: inside the input {item.given} (it would read its "
                            "own shards)")


def _hash_inputs(found: Sequence[inputs.Input], total: int, progress: Progress
                 ) -> list[sf.SourceInfo]:
    """Each input's sha256: of its file, or (a directory) of its files' names and hashes."""
    done = 0
    out = []
    for item in found:
        whole = hashlib.sha256()
        for source in item.sources:
            digest = hashlib.sha256()
            with open(source.path, "rb") as fh:
                while chunk := fh.read(1 << 20):
                    digest.update(chunk)
                    done += len(chunk)
                    progress("hashing inputs", done, total)
            if len(item.sources) == 1 and source.path == Path(item.given):
                whole = digest
            else:
                name = source.path.relative_to(item.given).as_posix()
                whole.update(f"{name}\0{digest.hexdigest()}\n".encode())
        out.append(sf.SourceInfo(item.given, whole.hexdigest()))
    return out


def _old_manifest(out: Path) -> sf.Manifest | None:
    if not (out / sf.MANIFEST).is_file():
        return None
    try:
        return sf.read_manifest(out)
    except sf.ShardError:
        return None     # unreadable: prepared again, and overwritten


def _up_to_date(old: sf.Manifest, options: Options, sources: list[sf.SourceInfo],
                encoder: encoders.Encoder | None, trained: Path) -> bool:
    if old.inputs != sources or old.options != options.recorded():
        return False
    if encoder is not None and old.tokenizer != encoder.info:
        return False
    if encoder is None and not (trained.is_file() and file_sha256(trained)
                                == old.tokenizer.sha256):
        return False
    return all((options.out / s.name).is_file()
               and (options.out / s.name).stat().st_size == s.bytes for s in old.shards())


def _batch_bytes(options: Options, encoder: encoders.Encoder | None) -> int:
    kind = encoder.info.kind if encoder is not None else encoders.TOKENIZER_JSON
    room = options.max_memory - peak_rss() - READ_RESERVE - KIND_RESERVE[kind]
    batch = room // BYTES_PER_TEXT_BYTE[kind]
    if batch < MIN_BATCH:
        raise UserError(f"--max-memory: {options.max_memory >> 20} MiB leaves no room: this "
                        f"process holds {peak_rss() >> 20} MiB before reading anything")
    return int(min(batch, MAX_BATCH))


def _texts(found: Sequence[inputs.Input], options: Options, batch_bytes: int, total: int,
           progress: Progress, stage: str) -> Iterator[str]:
    done = 0
    for texts, read in inputs.batches(found, options.field, batch_bytes):
        yield from texts
        done += read
        progress(stage, done, total)


def _is_val(index: int, fraction: float) -> bool:
    return int((index + 1) * fraction) > int(index * fraction)


def _write(found: Sequence[inputs.Input], options: Options, encoder: encoders.Encoder,
           sources: list[sf.SourceInfo], old: sf.Manifest | None, batch_bytes: int,
           total: int, progress: Progress) -> Report:
    dtype = sf.dtype_for(encoder.vocab_size)
    previous = {s.name: s for s in old.shards()} if old else {}
    writers = {split: ShardWriter(options.out, split, dtype, options.shard_tokens, previous)
               for split in sf.SPLITS}
    # The shards' dtype: a byte tokenizer's uint8 ids join it as they are, no wider.
    separator = np.asarray(encoder.separator, dtype=sf.DTYPES[dtype])
    index = done = 0
    try:
        for texts, read in _prefetched(inputs.batches(found, options.field, batch_bytes)):
            parts: dict[str, list[np.ndarray]] = {sf.TRAIN: [], sf.VAL: []}
            for ids in encoder.encode(texts):
                split = sf.VAL if _is_val(index, options.val_fraction) else sf.TRAIN
                parts[split] += [separator, ids]
                index += 1
            for split, arrays in parts.items():
                if arrays:
                    writers[split].add(np.concatenate(arrays))
            done += read
            progress("tokenizing", done, total)
        shards = {split: writer.close() for split, writer in writers.items()}
    finally:
        for writer in writers.values():
            writer.abandon()
    manifest = sf.Manifest(tokenizer=encoder.info, vocab_size=encoder.vocab_size,
                           dtype=dtype, train=shards[sf.TRAIN], val=shards[sf.VAL],
                           separator=list(encoder.separator), inputs=sources,
                           options=options.recorded())
    if not manifest.train:
        raise UserError(f"{', '.join(options.inputs)}: no training tokens (no documents, "
                        "or every one held out)")
    report = Report(manifest, input_bytes=total)
    for writer in writers.values():
        report.written += writer.written
        report.kept += writer.kept
    listed = {s.name for s in manifest.shards()}
    for path in sorted(options.out.iterdir()):
        stale = path.name.endswith(".bin") and path.name.split("-")[0] in sf.SPLITS
        if (stale and path.name not in listed) or path.name.startswith(TMP_PREFIX):
            path.unlink()
            report.deleted.append(path.name)
    text = manifest.text()
    target = options.out / sf.MANIFEST
    if not target.is_file() or target.read_text() != text:
        tmp = options.out / f"{TMP_PREFIX}{sf.MANIFEST}"
        tmp.write_text(text)
        tmp.replace(target)
    return report


def _prefetched(items: Iterator[T]) -> Iterator[T]:
    """``items``, the next one read by a thread while the caller works on this one.

    The tokenizers run their own threads without the GIL, so reading and cutting the next
    batch overlaps tokenizing this one; at most one batch waits (the memory bound counts
    it). An exception in the reader is raised here; leaving early stops the reader."""
    slot: queue.Queue = queue.Queue(maxsize=1)
    stop = threading.Event()

    def read() -> None:
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        slot.put((True, item), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            slot.put((False, None))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, raised there
            slot.put((False, exc))

    reader = threading.Thread(target=read, name="prepare-reader", daemon=True)
    reader.start()
    try:
        while True:
            more, item = slot.get()
            if not more:
                if item is not None:
                    raise item
                return
            yield item
    finally:
        stop.set()
        while reader.is_alive():    # let a reader blocked on a full slot see the stop
            try:
                slot.get(timeout=0.1)
            except queue.Empty:
                pass
        reader.join()
