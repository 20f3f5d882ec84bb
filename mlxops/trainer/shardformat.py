"""Token shards and their manifest: what ``mlxops data prepare`` writes and the trainer reads.

Standard library and numpy only (synced to nodes with the trainer). A shard is the de-facto
format of small-LM trainers (llm.c's ``dev/data/data_common.py``, modded-nanogpt's
``_load_data_shard``), so their shards read here and ours read there:

* a header of 256 little-endian int32: ``[0]`` magic, ``[1]`` version, ``[2]`` token count,
  the rest zero;
* then the tokens, little-endian: uint16 (magic 20240520, version 1: llm.c's GPT-2 shards)
  when every id fits, uint32 (magic 20240801, version 7: its LLaMA-3 shards) when the
  vocabulary is larger than 65,536.

The file is exactly ``1024 + count * itemsize`` bytes; a reader refuses anything else with a
one-line :class:`ShardError` naming the file (a shard cut short by a full disk, a file that
is not a shard). Only the two functions that move tokens import numpy: the controller's
commands that read a manifest (launch, plan, status) start without it.

The manifest (``manifest.json`` beside the shards) is one :class:`Manifest` record: the
tokenizer (its kind, name and the sha256 of what defines it), the vocabulary size the model
must have, the token dtype, the document separator, every shard (name, sha256, bytes,
tokens) of the training split and of the validation split, and what it was prepared from
(each input's sha256 and the options), which lets a re-run over unchanged input change
nothing. The shards' hashes are what launch and pre-flight compare a node's copy with.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from mlxops.node.protocol.decode import ProtocolError, Record, decode

if TYPE_CHECKING:
    import numpy as np

HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
#: (magic, version) of each token dtype, as llm.c writes them.
UINT16, UINT32 = "uint16", "uint32"
HEADERS = {UINT16: (20240520, 1), UINT32: (20240801, 7)}
#: numpy's names of the token dtypes (little-endian), and their sizes.
DTYPES = {UINT16: "<u2", UINT32: "<u4"}
ITEMSIZE = {UINT16: 2, UINT32: 4}
#: The largest vocabulary whose ids all fit in uint16.
UINT16_VOCAB = 1 << 16

MANIFEST = "manifest.json"
#: The trainer's ``data.source`` that reads a prepared directory (``data.path``): what
#: launch sets in each rank's config for a job's ``data:``.
SHARDS_SOURCE = "shards"
MANIFEST_FORMAT = 1
TRAIN, VAL = "train", "val"
SPLITS = (TRAIN, VAL)


class ShardError(ValueError):
    """A file that is not a whole shard, or a manifest that cannot be read."""


def dtype_for(vocab_size: int) -> str:
    """uint16 when every id of a ``vocab_size`` vocabulary fits, else uint32."""
    return UINT16 if vocab_size <= UINT16_VOCAB else UINT32


def shard_name(split: str, index: int) -> str:
    """``train-000003.bin``: zero-padded, so names sort like indices."""
    return f"{split}-{index:06d}.bin"


def header(dtype: str, count: int) -> bytes:
    """The 1024-byte header of a shard of ``count`` tokens of ``dtype``."""
    magic, version = HEADERS[dtype]
    if not 0 <= count < 1 << 31:
        raise ShardError(f"a shard holds at most 2**31-1 tokens, not {count}")
    return struct.pack(f"<{HEADER_INTS}i", magic, version, count, *[0] * (HEADER_INTS - 3))


def read_header(data: bytes, where: str = "shard") -> tuple[str, int]:
    """(dtype, token count) of a header; ShardError naming ``where`` when it is none."""
    if len(data) < HEADER_BYTES:
        raise ShardError(f"{where}: {len(data)} bytes, shorter than a shard's "
                         f"{HEADER_BYTES}-byte header")
    magic, version, count = struct.unpack_from("<3i", data)
    for dtype, known in HEADERS.items():
        if (magic, version) == known:
            if count < 0:
                raise ShardError(f"{where}: negative token count {count}")
            return dtype, count
    raise ShardError(f"{where}: not a token shard (magic {magic}, version {version}; "
                     f"known: {', '.join(f'{m} v{v} ({d})' for d, (m, v) in HEADERS.items())})")


def shard_bytes(dtype: str, count: int) -> int:
    """The size of a whole shard of ``count`` tokens."""
    return HEADER_BYTES + count * ITEMSIZE[dtype]


def open_shard(path: str | Path) -> np.ndarray:
    """The tokens of a shard, memory-mapped (read on demand, never loaded whole)."""
    import numpy as np

    path = Path(path)
    try:
        with open(path, "rb") as fh:
            dtype, count = read_header(fh.read(HEADER_BYTES), str(path))
        size = path.stat().st_size
    except OSError as exc:
        raise ShardError(f"{path}: {exc.strerror or exc}") from None
    if size != shard_bytes(dtype, count):
        raise ShardError(f"{path}: {size} bytes, but its header says {count} {dtype} tokens "
                         f"({shard_bytes(dtype, count)} bytes): cut short or overwritten")
    if count == 0:
        return np.zeros(0, dtype=DTYPES[dtype])
    return np.memmap(path, dtype=DTYPES[dtype], mode="r", offset=HEADER_BYTES, shape=(count,))


def write_tokens(fh: BinaryIO, tokens: np.ndarray, dtype: str) -> memoryview:
    """``tokens`` as ``dtype`` (little-endian) written to ``fh``; the bytes written (a view,
    for a running hash). Refuses an id the dtype cannot hold instead of wrapping it."""
    import numpy as np

    if tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) >= 1 << (
            8 * ITEMSIZE[dtype])):
        raise ShardError(f"token id {int(tokens.max())} does not fit in {dtype}")
    data = memoryview(np.ascontiguousarray(tokens, dtype=DTYPES[dtype])).cast("B")
    fh.write(data)
    return data


# --- the manifest ---------------------------------------------------------------------------


@dataclass
class TokenizerInfo(Record):
    """Which tokenizer made the ids: ``kind`` (bytes, tokenizer.json, tiktoken), a
    ``name`` for people, and the sha256 of what defines it (the file's bytes)."""

    kind: str
    name: str
    sha256: str


@dataclass
class ShardInfo(Record):
    name: str           # file name beside the manifest
    sha256: str         # of the whole file, header included
    bytes: int
    tokens: int


@dataclass
class SourceInfo(Record):
    """An input as it was read: its path as given, and the sha256 of its content."""

    path: str
    sha256: str


@dataclass
class Manifest(Record):
    tokenizer: TokenizerInfo
    vocab_size: int             # the model's vocabulary (model.vocab_size)
    dtype: str                  # UINT16 | UINT32
    train: list[ShardInfo]
    val: list[ShardInfo]
    separator: list[int] = field(default_factory=list)  # tokens between two documents
    inputs: list[SourceInfo] = field(default_factory=list)
    #: The options that change the output (shard size, validation share, field, ...).
    options: dict[str, Any] = field(default_factory=dict)
    format: int = MANIFEST_FORMAT

    def shards(self, split: str | None = None) -> list[ShardInfo]:
        """The shards of ``split``, or all of them (training first)."""
        if split is None:
            return [*self.train, *self.val]
        return list(self.train if split == TRAIN else self.val)

    def tokens(self, split: str) -> int:
        return sum(s.tokens for s in self.shards(split))

    def text(self) -> str:
        """The file's content: sorted keys, so equal manifests are equal bytes."""
        return json.dumps(self.to_dict(), indent=1, sort_keys=True) + "\n"


def check_manifest(manifest: Manifest, where: str) -> Manifest:
    """The rules a decoded manifest must also keep, each refused in one line."""
    if manifest.format != MANIFEST_FORMAT:
        raise ShardError(f"{where}: manifest format {manifest.format}; this mlxops reads "
                         f"format {MANIFEST_FORMAT}")
    if manifest.dtype not in HEADERS:
        raise ShardError(f"{where}: dtype: {manifest.dtype!r}, not one of "
                         f"{', '.join(HEADERS)}")
    if manifest.vocab_size < 1 or (dtype_for(manifest.vocab_size) == UINT32
                                   and manifest.dtype == UINT16):
        raise ShardError(f"{where}: vocab_size {manifest.vocab_size} does not fit in "
                         f"{manifest.dtype}")
    names = [s.name for s in manifest.shards()]
    for name in names:
        if not name or "/" in name or name.startswith(".") or name == MANIFEST:
            raise ShardError(f"{where}: shard name {name!r}: a plain file name beside the "
                             "manifest")
    if len(set(names)) != len(names):
        raise ShardError(f"{where}: a shard is listed twice")
    if not manifest.train:
        raise ShardError(f"{where}: no training shard")
    return manifest


def parse_manifest(text: str, where: str = MANIFEST) -> Manifest:
    """A manifest from its JSON text; ShardError (one line, naming ``where``) if not one."""
    try:
        return check_manifest(decode(Manifest, json.loads(text)), where)
    except (ValueError, ProtocolError) as exc:
        if isinstance(exc, ShardError):
            raise
        raise ShardError(f"{where}: not a token-shard manifest: {exc}") from None


def read_manifest(directory: str | Path) -> Manifest:
    """The manifest of a prepared directory."""
    path = Path(directory) / MANIFEST
    try:
        text = path.read_text()
    except OSError as exc:
        raise ShardError(f"{path}: {exc.strerror or exc} (prepare it with "
                         "'mlxops data prepare')") from None
    return parse_manifest(text, str(path))
