"""Benchmark: ``mlxops data prepare`` against the tokenizer called directly, same input.

The corpus is generated from CPython's documentation topics (``pydoc_data.topics``): its
paragraphs in a seeded random order, repeated until ``--mb`` MiB of text. The tokenizer is
a byte-level BPE of ``--vocab`` tokens trained on the topics (a ``tokenizer.json``).

* **prepare**: ``mlxops.dataprep.prepare.prepare`` (what the CLI runs, without the Python
  start): hashes the input, reads paragraphs, tokenizes in batches bounded by
  ``--max-memory``, writes uint16 shards hashing them as they go, and the manifest.
* **direct**: what a hand-written script does with the same tokenizer: read the file in
  ~8 MiB pieces cut at a blank line, split into paragraphs, ``encode_batch_fast`` each
  piece (the library's own threads), the ids after an end-of-text token as uint16 to one
  file. No hashing, no manifest, no memory bound.

Both in this process, alternated, ``--repeat`` times each (the page cache warm for both:
one untimed read of the corpus first); the figure is input MiB/s, median. The target
(issue 19): prepare at least 0.9x direct.

    .venv/bin/python benchmarks/data.py [--mb 64] [--vocab 4096] [--repeat 3]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from pydoc_data.topics import topics

import numpy as np

from mlxops.dataprep import encoders
from mlxops.dataprep import prepare as prep

PIECE = 8 << 20


def make_corpus(path: Path, mib: int) -> int:
    paragraphs = [p for k in sorted(topics) for p in topics[k].split("\n\n") if p.strip()]
    rng = np.random.default_rng(0)
    with open(path, "w") as fh:
        while fh.tell() < mib << 20:
            for i in rng.permutation(len(paragraphs)):
                fh.write(paragraphs[i].strip("\n") + "\n\n")
    return path.stat().st_size


def direct(corpus: Path, tokenizer, eot: int, out: Path) -> None:
    with open(corpus, encoding="utf-8") as src, open(out, "wb") as dst:
        rest = ""
        while True:
            chunk = src.read(PIECE)
            text = rest + chunk
            if chunk:
                cut = text.rfind("\n\n")
                if cut < 0:
                    rest = text
                    continue
                text, rest = text[:cut], text[cut + 2:]
            docs = [d for d in text.split("\n\n") if d.strip()]
            ids = []
            for enc in tokenizer.encode_batch_fast(docs, add_special_tokens=False):
                ids.append([eot])
                ids.append(enc.ids)
            if ids:
                np.concatenate([np.asarray(i, dtype=np.uint32) for i in ids]
                               ).astype(np.uint16).tofile(dst)
            if not chunk:
                break


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=64, help="corpus size, MiB")
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--max-memory", default="2G")
    args = parser.parse_args()
    from mlxops.cli.data import parse_size

    work = Path(tempfile.mkdtemp(prefix="mlxops-bench-data-"))
    try:
        corpus = work / "corpus.txt"
        size = make_corpus(corpus, args.mb)
        tok_path = work / "tokenizer.json"
        encoders.train_bpe((topics[k] for k in sorted(topics)), args.vocab, tok_path)
        tokenizer = encoders.TokenizersEncoder(tok_path).tokenizer
        eot = tokenizer.token_to_id(encoders.END_OF_TEXT[0])
        corpus.read_bytes()     # the page cache warm for both sides
        times: dict[str, list[float]] = {"prepare": [], "direct": []}
        for run in range(args.repeat):
            out = work / f"out-{run}"
            start = time.perf_counter()
            report = prep.prepare(prep.Options(inputs=(str(corpus),), out=out,
                                               tokenizer=str(tok_path), val_fraction=0.01,
                                               max_memory=parse_size(args.max_memory)))
            times["prepare"].append(time.perf_counter() - start)
            shutil.rmtree(out)
            start = time.perf_counter()
            direct(corpus, tokenizer, eot, work / "direct.bin")
            times["direct"].append(time.perf_counter() - start)
            (work / "direct.bin").unlink()
        tokens = report.manifest.tokens("train") + report.manifest.tokens("val")
        mib = size / 2**20
        print(f"corpus: {mib:.1f} MiB of text, {tokens:,} tokens (BPE {args.vocab}, "
              f"{size / tokens:.2f} bytes a token); prepare --max-memory {args.max_memory}")
        rates = {}
        for side, seconds in times.items():
            rates[side] = mib / statistics.median(seconds)
            print(f"{side:8s} {rates[side]:7.2f} MiB/s   (runs: "
                  f"{', '.join(f'{s:.2f} s' for s in seconds)})")
        print(f"prepare / direct: {rates['prepare'] / rates['direct']:.2f}x (target >= 0.9x)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
