"""The tokenizers of ``mlxops data prepare``, behind one interface: texts in, id arrays out.

``--tokenizer`` names one:

* ``bytes`` — each UTF-8 byte a token (vocabulary 256), what the bundled trainer reads from
  ``text`` and ``jsonl`` sources; needs nothing;
* a path to a ``tokenizer.json`` — the Hugging Face ``tokenizers`` library's file (every
  Hugging Face model ships one); ``--train-bpe VOCAB`` makes one first (byte-level BPE
  trained on the inputs, with ``<|endoftext|>``), saved beside the shards;
* ``tiktoken:FILE`` — a tiktoken encoding from its ranks file on disk (``cl100k_base.tiktoken``,
  ``o200k_base.tiktoken``, ...): the file's name says which encoding, whose pattern and
  special tokens come from tiktoken, and its sha256 must be the one tiktoken pins. Nothing is
  downloaded: fetch the file where a network is allowed, and pass its path.

Each knows its identity for the manifest (kind, name, sha256 of what defines it), its
vocabulary size (the model's ``vocab_size``) and the separator written before every
document: its end-of-text token, or the tokens of a blank line when it has none.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from mlxops.dataprep.optional import need
from mlxops.errors import UserError, bad_input
from mlxops.trainer.shardformat import TokenizerInfo

BYTES, TOKENIZER_JSON, TIKTOKEN = "bytes", "tokenizer.json", "tiktoken"
TIKTOKEN_PREFIX = "tiktoken:"
#: End-of-text tokens, in the order they are looked for in a tokenizer.json's added tokens.
END_OF_TEXT = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|im_end|>")
BLANK_LINE = "\n\n"
#: Below this a byte-level BPE has no merges (256 bytes + the end-of-text token).
MIN_TRAINED_VOCAB = 258


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Encoder:
    """A tokenizer: ``encode`` maps texts to id arrays (one per text, in order)."""

    info: TokenizerInfo
    vocab_size: int
    separator: list[int]

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        raise NotImplementedError


class ByteEncoder(Encoder):
    def __init__(self) -> None:
        self.info = TokenizerInfo(BYTES, BYTES, _sha256(b"utf-8 bytes"))
        self.vocab_size = 256
        self.separator = list(BLANK_LINE.encode())

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        return [np.frombuffer(t.encode(), dtype=np.uint8) for t in texts]


class TokenizersEncoder(Encoder):
    """A ``tokenizer.json`` through the ``tokenizers`` library (its own threads)."""

    def __init__(self, path: Path, name: str | None = None):
        library = need("tokenizers", "--tokenizer tokenizer.json")
        try:
            data = path.read_bytes()
            self.tokenizer = library.Tokenizer.from_str(data.decode())
        except (OSError, UnicodeDecodeError, Exception) as exc:  # noqa: BLE001 - its errors
            raise bad_input(path, None, f"not a tokenizer.json: {exc}") from None
        self.info = TokenizerInfo(TOKENIZER_JSON, name or path.name, _sha256(data))
        self.vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True)
        eot = [self.tokenizer.token_to_id(t) for t in END_OF_TEXT]
        found = [i for i in eot if i is not None]
        self.separator = found[:1] or self.tokenizer.encode(
            BLANK_LINE, add_special_tokens=False).ids

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        fast = getattr(self.tokenizer, "encode_batch_fast", self.tokenizer.encode_batch)
        return [np.asarray(e.ids, dtype=np.uint32)
                for e in fast(texts, add_special_tokens=False)]


class TiktokenEncoder(Encoder):
    def __init__(self, path: Path):
        tiktoken = need("tiktoken", "--tokenizer tiktoken:FILE")
        load = need("tiktoken.load", "--tokenizer tiktoken:FILE")
        public = need("tiktoken_ext.openai_public", "--tokenizer tiktoken:FILE")
        name = path.name.removesuffix(".tiktoken")
        constructors = public.ENCODING_CONSTRUCTORS
        if name not in constructors:
            raise bad_input(path, "--tokenizer", f"not a tiktoken encoding's file: name it "
                                                 f"after one of {', '.join(constructors)}")
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise bad_input(path, "--tokenizer", exc.strerror or str(exc)) from None
        wanted: list[str | None] = []

        def from_file(_url: str, expected_hash: str | None = None) -> dict[bytes, int]:
            # tiktoken's constructor names its download; the bytes come from the file.
            wanted.append(expected_hash)
            if expected_hash and _sha256(data) != expected_hash:
                raise bad_input(path, "--tokenizer", f"not tiktoken's {name} (sha256 "
                                                     f"{_sha256(data)[:12]}, tiktoken pins "
                                                     f"{expected_hash[:12]})")
            return load.load_tiktoken_bpe(str(path))

        original = public.load_tiktoken_bpe
        public.load_tiktoken_bpe = from_file
        try:
            spec = constructors[name]()
        finally:
            public.load_tiktoken_bpe = original
        if not wanted:      # an encoding in another file format (gpt2's): say so, not fetch
            raise bad_input(path, "--tokenizer", f"{name} is not read from a .tiktoken file")
        self.encoding = tiktoken.Encoding(**spec)
        self.info = TokenizerInfo(TIKTOKEN, name, _sha256(data))
        self.vocab_size = self.encoding.n_vocab
        self.separator = [self.encoding.eot_token]

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        return [np.asarray(ids, dtype=np.uint32)
                for ids in self.encoding.encode_ordinary_batch(texts)]


def open_encoder(word: str) -> Encoder:
    """``--tokenizer``'s value as an encoder (``tokenizer.json``: a path)."""
    if word == BYTES:
        return ByteEncoder()
    if word.startswith(TIKTOKEN_PREFIX):
        return TiktokenEncoder(Path(word[len(TIKTOKEN_PREFIX):]))
    path = Path(word)
    if path.is_dir() and (path / TOKENIZER_JSON).is_file():
        path = path / TOKENIZER_JSON      # a model's directory
    if not path.is_file():
        raise UserError(f"--tokenizer: {word}: not 'bytes', 'tiktoken:FILE' or a "
                        "tokenizer.json")
    return TokenizersEncoder(path)


def train_bpe(texts: Iterable[str], vocab_size: int, out: Path) -> TokenizersEncoder:
    """A byte-level BPE of ``vocab_size`` trained on ``texts`` (one pass), saved to ``out``.

    Deterministic: the same texts give the same file (the trainer breaks ties between
    equally frequent pairs by the pair itself, not by hash order)."""
    library = need("tokenizers", "--train-bpe")
    if vocab_size < MIN_TRAINED_VOCAB:
        raise UserError(f"--train-bpe: {vocab_size}: a byte-level BPE needs at least "
                        f"{MIN_TRAINED_VOCAB} (256 bytes, end-of-text, merges)")
    tokenizer = library.Tokenizer(library.models.BPE())
    tokenizer.pre_tokenizer = library.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = library.decoders.ByteLevel()
    trainer = library.trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[END_OF_TEXT[0]], show_progress=False,
        initial_alphabet=library.pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(_chunks(texts), trainer)
    tmp = out.with_name(f".{out.name}.tmp")
    tokenizer.save(str(tmp))
    if out.is_file() and out.read_bytes() == tmp.read_bytes():
        tmp.unlink()        # the same tokenizer: the file stays as it was
    else:
        tmp.replace(out)
    return TokenizersEncoder(out, f"{TOKENIZER_JSON} (trained BPE, {vocab_size})")


def _chunks(texts: Iterable[str]) -> Iterator[list[str]]:
    """Texts in lists of ~1 MB: the trainer takes batches (fewer calls into Rust)."""
    batch: list[str] = []
    size = 0
    for text in texts:
        batch.append(text)
        size += len(text)
        if size > 1 << 20:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def describe(encoder: Any) -> str:
    info = encoder.info
    return f"{info.name} (vocabulary {encoder.vocab_size})"
