"""The ``sample`` node command: memory, load and GPU figures, rank 0's metrics tailed by
byte offset, the job's status; asked with the controller's argument list, answered as the
controller reads it (docs/node-protocol.md)."""

from __future__ import annotations

import json
import os
from contextlib import redirect_stdout
from io import StringIO
from pathlib import Path

import pytest

from mlxops.node import protocol
from mlxops.node.__main__ import main
from mlxops.node.sample import ioreg_gpu, linux_memory, metrics_chunk, vm_stat_used

DATA = Path(__file__).parents[1] / "data" / "monitor"


def ask(argv: list[str]) -> protocol.SampleAnswer:
    out = StringIO()
    with redirect_stdout(out):
        assert main(argv) == 0
    return protocol.parse_answer(argv[0], out.getvalue().strip())


def test_vm_stat_counts_memory_as_activity_monitor_does():
    used = vm_stat_used((DATA / "vm_stat.txt").read_text())
    # app memory (anonymous - purgeable) + wired + compressed, 16 KiB pages
    assert used == (514552 - 7811 + 198431 + 98765) * 16384


def test_vm_stat_of_an_older_macos_without_anonymous_pages_counts_active_pages():
    text = "\n".join(line for line in (DATA / "vm_stat.txt").read_text().splitlines()
                     if not line.startswith("Anonymous"))
    assert vm_stat_used(text) == (443562 + 198431 + 98765) * 16384
    assert vm_stat_used("Pages free: 12.\n") is None


def test_ioreg_gives_gpu_utilization_and_memory_without_sudo():
    gpu = ioreg_gpu((DATA / "ioreg_accelerator.txt").read_text())
    assert gpu == protocol.GpuSample(utilization=41.0, renderer=37.0,
                                     memory_in_use=1266434048)
    assert ioreg_gpu("+-o IOAccelerator\n  {\n  }\n") is None


def test_linux_memory_in_use_is_total_less_available():
    meminfo = "MemTotal:       16384000 kB\nMemFree:  100 kB\nMemAvailable:   12288000 kB\n"
    assert linux_memory(meminfo) == (16384000 * 1024, 4096000 * 1024)
    assert linux_memory("nonsense\n") == (None, None)


def test_metrics_are_read_by_whole_lines_from_the_offset(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n{"ste')
    first = metrics_chunk(path, 0, None, 1 << 20)
    assert first.text == '{"step": 1}\n{"step": 2}\n' and not first.reset
    assert first.offset == len(first.text)  # the line being written waits
    with open(path, "a") as f:
        f.write('p": 3}\n')
    second = metrics_chunk(path, first.offset, first.inode, 1 << 20)
    assert second.text == '{"step": 3}\n' and second.offset == path.stat().st_size
    assert metrics_chunk(tmp_path / "none.jsonl", 0, None, 100) is None


def test_a_rewritten_metrics_file_is_read_again_from_the_start(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in range(1, 6)))
    seen = metrics_chunk(path, 0, None, 1 << 20)
    # The trainer resumes from step 3: it rewrites the file atomically (a new inode), then
    # logs again; by the next look the file may even be longer than before.
    tmp = tmp_path / "metrics.tmp"
    tmp.write_text("".join(json.dumps({"step": s, "again": True}) + "\n" for s in range(1, 7)))
    os.replace(tmp, path)
    again = metrics_chunk(path, seen.offset, seen.inode, 1 << 20)
    assert again.reset and again.text.count("again") == 6
    # Shorter than what was read (truncated in place): from the start too.
    path.write_text('{"step": 1}\n')
    assert metrics_chunk(path, again.offset, None, 1 << 20).reset


def test_sample_answers_with_figures_status_and_metrics(tmp_path):
    run_dir = tmp_path / "runs" / "j"
    (run_dir / protocol.PROGRESS_DIR).mkdir(parents=True)
    (run_dir / protocol.METRICS).write_text('{"step": 1, "loss": 5.0}\n')
    (run_dir / protocol.process_file(0, protocol.SCRIPT)).write_text("exit 0\n")
    answer = ask(protocol.sample_args(str(run_dir), status=True, metrics_from=0))
    assert isinstance(answer, protocol.SampleAnswer)
    assert answer.system and answer.cpus and answer.cpus >= 1
    assert answer.memory_total and 0 < answer.memory_used <= answer.memory_total
    assert len(answer.load) == 3
    assert answer.metrics.text == '{"step": 1, "loss": 5.0}\n'
    assert answer.status.exists and [r.rank for r in answer.status.ranks] == [0]
    # Without a run directory, only the node's own figures.
    bare = ask(protocol.sample_args())
    assert bare.status is None and bare.metrics is None and bare.memory_total


def test_sample_args_ask_only_what_is_wanted():
    assert protocol.sample_args() == ["sample"]
    assert protocol.sample_args("/r", status=True) == ["sample", "--run-dir", "/r", "--status"]
    args = protocol.sample_args("/r", metrics_from=120, metrics_inode=7)
    assert args == ["sample", "--run-dir", "/r", "--metrics-from", "120",
                    "--metrics-inode", "7"]
    parsed = protocol.parser().parse_args(args)
    assert (parsed.run_dir, parsed.metrics_from, parsed.metrics_inode, parsed.status) == \
        ("/r", 120, 7, False)


def test_an_answer_without_a_required_field_is_refused():
    with pytest.raises(protocol.ProtocolError, match="'now'"):
        protocol.parse_answer(protocol.SAMPLE, json.dumps({"system": "Darwin"}))
