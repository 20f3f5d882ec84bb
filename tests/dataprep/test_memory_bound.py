"""``mlxops data prepare --max-memory`` over corpora larger than the bound: the peak RSS
the kernel reports while the CLI runs stays within it.

Real processes over ~100 MiB of text (the byte-level case 5 s, the tokenizer.json case
40-90 s on a 2-core machine), so they run with the trainer's and fine-tuning's process
tests rather than among the unit tests (docs/testing.md, "Where a test lives").
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from pydoc_data.topics import topics

import numpy as np
import pytest

from mlxops.dataprep import encoders
from mlxops.trainer import shardformat as sf

DOCS = [topics[k] for k in sorted(topics)]


def _peak_while_running(proc: subprocess.Popen) -> int:
    """The largest ``VmHWM`` (peak RSS) the kernel reports for ``proc`` until it ends."""
    peak = 0
    while proc.poll() is None:
        try:
            with open(f"/proc/{proc.pid}/status") as fh:
                hwm = [line for line in fh if line.startswith("VmHWM:")]
            peak = max(peak, int(hwm[0].split()[1]) * 1024) if hwm else peak
        except OSError:
            pass
        time.sleep(0.05)
    return peak


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="needs /proc")
def test_a_corpus_larger_than_the_memory_bound(tmp_path):
    """``mlxops data prepare --max-memory 88M`` over a 96 MiB corpus (generated: paragraphs
    of words drawn from the topics), its peak RSS read from the kernel while it runs."""
    words = np.array(" ".join(DOCS).split())
    rng = np.random.default_rng(0)
    block = "\n\n".join(" ".join(rng.choice(words, size=12)) for _ in range(4000)) + "\n\n"
    corpus = tmp_path / "big.txt"
    with open(corpus, "w") as fh:
        for i in range((96 << 20) // len(block) + 1):
            fh.write(f"{i}\n\n{block}")
    size, bound = corpus.stat().st_size, 88 << 20
    proc = subprocess.Popen([sys.executable, "-m", "mlxops", "data", "prepare", str(corpus),
                             "-o", str(tmp_path / "out"), "--max-memory", "88M", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    peak = _peak_while_running(proc)
    out, err = proc.communicate()
    assert proc.returncode == 0, err.decode()
    report = json.loads(out)
    assert size > bound and 0 < peak <= bound and report["peak_memory"] <= bound, (
        size, peak, report["peak_memory"])
    manifest = sf.read_manifest(tmp_path / "out")
    # Paragraphs: each written after a blank line, its own blank line not kept.
    assert manifest.tokens("train") + manifest.tokens("val") == size


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="needs /proc")
def test_a_tokenizer_json_stays_within_the_memory_bound(tmp_path):
    """The same bound with a ``tokenizer.json`` (a byte-level BPE of 512 tokens trained by
    mlxops/devtools/tinymodels.py: a small vocabulary makes the most tokens, so the most
    memory, per byte of text) over a corpus larger than the bound."""
    pytest.importorskip("tokenizers")
    from mlxops.devtools.tinymodels import docstring_paragraphs, write_tokenizer

    (tmp_path / "tok").mkdir()
    write_tokenizer(tmp_path / "tok", [text for _, text in docstring_paragraphs()])
    words = np.array(" ".join(DOCS).split())
    rng = np.random.default_rng(1)
    block = "\n\n".join(" ".join(rng.choice(words, size=12)) for _ in range(4000)) + "\n\n"
    # 100 MiB: the tokenizers library's reserve (KIND_RESERVE) and the reader's on top of
    # what the process holds at its start (40-47 MiB, by the machine) leave ~200 KiB
    # batches; at 88 MiB a fresh venv's start left less than MIN_BATCH (refused, exit 2).
    corpus, bound = tmp_path / "big.txt", 100 << 20
    with open(corpus, "w") as fh:
        for i in range((104 << 20) // len(block) + 1):
            fh.write(f"{i}\n\n{block}")
    proc = subprocess.Popen([sys.executable, "-m", "mlxops", "data", "prepare", str(corpus),
                             "-o", str(tmp_path / "out"), "--max-memory", "100M", "--json",
                             "--tokenizer", str(tmp_path / "tok" / "tokenizer.json")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    peak = _peak_while_running(proc)
    out, err = proc.communicate()
    assert proc.returncode == 0, err.decode()
    report = json.loads(out)
    assert corpus.stat().st_size > bound and 0 < peak <= bound, (peak, report["peak_memory"])
    assert report["peak_memory"] <= bound
    assert sf.read_manifest(tmp_path / "out").tokenizer.kind == encoders.TOKENIZER_JSON
