"""Tiny language models and fine-tuning data, made here: nothing is downloaded in tests.

A model is a directory in the Hugging Face / mlx-lm layout, written by mlx-lm's own code
from mlx-lm's own model classes (``mlx_lm.models.llama``, ``mlx_lm.models.qwen2``) with
random weights drawn from a seed: ``config.json``, ``model.safetensors`` (+ its index),
``tokenizer.json`` (a byte-level BPE trained with ``tokenizers`` on the corpus below) and
``tokenizer_config.json`` with a chat template (ChatML, the format of Qwen2's template:
``<|im_start|>role\\ncontent<|im_end|>\\n``). One architecture can be quantized with
``mlx_lm.utils.quantize_model`` (4 bits, groups of 32), as ``mlx_lm.convert -q`` does. So
``mlx_lm.load``, ``mlx_lm.generate``, ``mlx_lm.lora`` and ``mlx_lm.fuse`` take them as they
take a real model: the loading code under test is the real one.

The data is real text that ships with Python: the first paragraph of the docstring of
standard-library modules (:data:`MODULES`), as ``train.jsonl`` / ``valid.jsonl`` in each
of mlx-lm's three formats: chat ``messages`` (a question about the module, the docstring
as the answer), ``prompt``/``completion`` (the same pair) and ``text``. The questions are
made here (illustrative); the answers are the docstrings, word for word.

    python -m mlxops.devtools.tinymodels DIR     # DIR/llama, DIR/qwen2-4bit, DIR/data/...

Not synced to nodes: the tests and the benchmark build these on the controller and place
them like any model directory.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path

#: Standard-library modules whose docstrings are the corpus (each has a first paragraph of
#: at least a sentence in CPython 3.10-3.13).
MODULES = (
    "abc", "argparse", "ast", "base64", "bdb", "bisect", "calendar", "cmd", "code",
    "codecs", "colorsys", "configparser", "contextlib", "copy", "csv", "dataclasses",
    "difflib", "dis", "doctest", "email", "enum", "filecmp", "fileinput", "fnmatch",
    "fractions", "ftplib", "functools", "getopt", "getpass", "gettext", "glob", "gzip",
    "hashlib", "heapq", "hmac", "html", "http", "imaplib", "inspect", "ipaddress", "json",
    "keyword", "linecache", "locale", "logging", "lzma", "mimetypes", "numbers",
    "opcode", "operator", "optparse", "os", "pathlib", "pdb", "pickle", "pkgutil",
    "platform", "plistlib", "poplib", "pprint", "profile", "pstats", "py_compile",
    "pyclbr", "queue", "quopri", "random", "re", "reprlib", "rlcompleter", "runpy",
    "sched", "secrets", "selectors", "shelve", "shlex", "shutil", "signal", "site",
    "smtplib", "socket", "socketserver", "sqlite3", "stat", "statistics", "string",
    "struct", "subprocess", "symtable", "tabnanny", "tarfile", "tempfile", "textwrap",
    "threading", "timeit", "token", "tokenize", "trace", "traceback", "tracemalloc",
    "types", "typing", "uuid", "warnings", "wave", "weakref", "webbrowser", "zipapp",
    "zipfile",
)
#: Every eighth example goes to valid.jsonl, the rest to train.jsonl.
VALID_EVERY = 8
#: At most this many characters of a docstring's first paragraph (whole words).
MAX_CHARS = 240

SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
VOCAB_SIZE = 512

#: The two architectures, as their config.json (``vocab_size`` is the tokenizer's).
ARCHITECTURES: dict[str, dict] = {
    "llama": {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
              "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
              "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True,
              "max_position_embeddings": 2048},
    "qwen2": {"model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 2,
              "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
              "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": True,
              "max_position_embeddings": 2048},
}
FORMATS = ("chat", "completions", "text")


def docstring_paragraphs() -> list[tuple[str, str]]:
    """``(module, first paragraph of its docstring)`` for each of :data:`MODULES` that
    has one here, whitespace joined, cut at a word to :data:`MAX_CHARS`."""
    out = []
    for name in MODULES:
        try:
            doc = importlib.import_module(name).__doc__ or ""
        except ImportError:
            continue
        first = " ".join(doc.strip().split("\n\n")[0].split())
        if len(first) > MAX_CHARS:
            first = first[:MAX_CHARS].rsplit(" ", 1)[0]
        if len(first.split()) >= 3:
            out.append((name, first))
    return out


def train_tokenizer(texts: list[str], vocab_size: int = VOCAB_SIZE):
    """A byte-level BPE (GPT-2's pre-tokenizer and decoder) trained on ``texts``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer)
    return tok


def write_tokenizer(out: Path, texts: list[str]) -> int:
    """``tokenizer.json`` and ``tokenizer_config.json`` in ``out``; the vocabulary size."""
    tok = train_tokenizer(texts)
    tok.save(str(out / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None,
              "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
              "unk_token": None, "model_max_length": 2048, "chat_template": CHAT_TEMPLATE,
              "clean_up_tokenization_spaces": False}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return tok.get_vocab_size()


def build_model(out: str | Path, arch: str = "llama", *, quantize: bool = False,
                seed: int = 0) -> Path:
    """A tiny ``arch`` model in ``out`` (created): random weights from ``seed``, the
    tokenizer, and with ``quantize`` 4-bit weights as ``mlx_lm.convert -q`` writes them."""
    import mlx.core as mx
    from mlx_lm.utils import _get_classes, quantize_model, save_config, save_model

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    vocab = write_tokenizer(out, [t for _, t in docstring_paragraphs()])
    config = dict(ARCHITECTURES[arch], vocab_size=vocab)
    with open(out / "tokenizer.json") as f:
        specials = {t["content"]: t["id"] for t in json.load(f)["added_tokens"]}
    config["eos_token_id"] = specials["<|im_end|>"]
    model_class, args_class = _get_classes(config)
    mx.random.seed(seed)
    model = model_class(args_class.from_dict(config))
    mx.eval(model.parameters())
    if quantize:
        model, config = quantize_model(model, config, group_size=32, bits=4)
    save_model(out, model)
    save_config(config, out / "config.json")
    return out


def examples(kind: str) -> list[dict]:
    """Every example of one of :data:`FORMATS`, in :data:`MODULES` order."""
    rows = []
    for name, text in docstring_paragraphs():
        question = f"What is the Python module {name} for?"
        if kind == "chat":
            rows.append({"messages": [{"role": "user", "content": question},
                                      {"role": "assistant", "content": text}]})
        elif kind == "completions":
            rows.append({"prompt": question, "completion": text})
        elif kind == "text":
            rows.append({"text": f"{name}: {text}"})
        else:
            raise ValueError(f"unknown data format {kind!r}; one of {', '.join(FORMATS)}")
    return rows


def write_dataset(out: str | Path, kind: str = "chat") -> Path:
    """``train.jsonl`` and ``valid.jsonl`` of one format in ``out`` (created)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows = examples(kind)
    valid = [r for i, r in enumerate(rows) if i % VALID_EVERY == VALID_EVERY - 1]
    train = [r for i, r in enumerate(rows) if i % VALID_EVERY != VALID_EVERY - 1]
    for name, part in (("train", train), ("valid", valid)):
        (out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    return out


@dataclass(frozen=True)
class TinySet:
    """What :func:`build_all` made: two models, and a data directory per format."""

    llama: Path
    qwen2_4bit: Path
    data: dict[str, Path]


def build_all(root: str | Path, seed: int = 0) -> TinySet:
    """``root/llama``, ``root/qwen2-4bit`` and ``root/data/<format>`` for every format."""
    root = Path(root)
    return TinySet(
        llama=build_model(root / "llama", "llama", seed=seed),
        qwen2_4bit=build_model(root / "qwen2-4bit", "qwen2", quantize=True, seed=seed),
        data={kind: write_dataset(root / "data" / kind, kind) for kind in FORMATS})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mlxops.devtools.tinymodels",
                                description="Write tiny models (llama, 4-bit qwen2) and "
                                            "fine-tuning data (chat, completions, text).")
    p.add_argument("dir", help="where to write them (DIR/llama, DIR/qwen2-4bit, DIR/data/*)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    args = p.parse_args(argv)
    made = build_all(args.dir, args.seed)
    print(f"{made.llama}\n{made.qwen2_4bit}\n" + "\n".join(map(str, made.data.values())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
