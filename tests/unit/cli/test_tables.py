"""Every table mlxops prints stays readable in 80 columns, and whole through a pipe.

Readable means: nothing cut to an ellipsis, every header on one line and whole, no line
wider than the terminal. Each table is rendered exactly as the CLI renders it, into an
80-column console, with realistic values (Mac host names, chip names, a job in trouble).
"""

from __future__ import annotations

import base64
import os
import re
import subprocess
import sys
from pathlib import Path

import paramiko
import pytest
from table_render import assert_readable, render

from mlxops import console
from mlxops.cli.plan import plan_notes, plan_table
from mlxops.cli.provision_output import task_table
from mlxops.cli.trust import key_blocks
from mlxops.cli.watch import status_table
from mlxops.jobs.status import JobStatus, RankStatus
from mlxops.planning import NodePlan
from mlxops.tasks.python import skew_table
from mlxops.trainer.plan import plan_memory
from mlxops.transport import HostResult, Results
from mlxops.transport.results import CommandResult
from mlxops.trust import HostKeyCheck

ROOT = Path(__file__).resolve().parents[3]
GB = 1024**3
HOSTS = ["studio1", "studio2", "mini-rack-07", "macbook-pro"]
CHIPS = ["Apple M2 Ultra", "Apple M2 Ultra", "Apple M4 Pro", "Apple M3 Max"]


def node_plans() -> list[NodePlan]:
    config = {"model": {"dims": 1024, "layers": 16, "heads": 16, "seq_len": 1024},
              "train": {"global_batch": 48, "micro_batch": 8}}
    memory = [192 * GB, 192 * GB, 24 * GB, 36 * GB]
    slots = [2, 2, 1, 1]
    return [NodePlan(h, m, c, s, plan_memory(config, m, sum(slots), ranks_per_node=s),
                     "cached facts")
            for h, m, c, s in zip(HOSTS, memory, CHIPS, slots, strict=True)]


def test_plan_table_fits_80_columns_and_says_the_rest_below():
    plans = node_plans()
    text = render(plan_table(plans))
    assert_readable(text, ["host", "mem GB", "ranks", "rank GB", "budget GB", "micro x acc",
                           "grad ckpt", "fits"])
    for p in plans:  # one line per node, its name whole
        assert re.search(rf"^{p.host}\s+{p.memory_bytes // GB}\s+{p.ranks}\s", text, re.M)
    notes = plan_notes(plans)
    assert "chip: Apple M2 Ultra (studio1, studio2)" in notes
    assert "chip: Apple M4 Pro (mini-rack-07)" in notes
    assert any(n.startswith("per rank: weights+moments ") for n in notes)
    assert notes[-1].endswith("global batch 48 = micro_batch "
                              f"{plans[0].plan.micro_batch} x accumulation "
                              f"{plans[0].plan.accumulation} x world 6")
    assert all(len(n) <= 80 for n in notes[:-1]), notes


def test_plan_notes_name_no_host_when_all_agree():
    plans = [p for p in node_plans() if p.host.startswith("studio")]
    notes = plan_notes(plans)
    assert notes[0] == "chip: Apple M2 Ultra"
    assert "(" not in notes[1]


def test_status_table_fits_80_columns():
    ranks = [RankStatus(0, "studio1", "running", 81234, step=1200, loss=2.3456,
                        tokens_per_sec=123456.0, heartbeat_age=0.4),
             RankStatus(1, "studio1", "running", 81235, step=1200, loss=2.3456,
                        tokens_per_sec=123456.0, heartbeat_age=0.5),
             RankStatus(2, "mini-rack-07", "failed", 7001, exit=137, step=1187,
                        heartbeat_age=42.0),
             RankStatus(3, "macbook-pro", "unreachable")]
    status = JobStatus("tiny-lm", "failed", ranks, attempt=2, steps=5000)
    text = render(status_table(status))
    assert_readable(text, ["rank", "host", "pid", "state", "step", "loss", "tok/s",
                           "heartbeat"])
    assert re.search(r"^\s*2\s+mini-rack-07\s+7001\s+failed \(137\)\s+1187\s+42\.0s ago$",
                     text, re.M), text


def test_recap_tables_fit_80_columns():
    results = Results({h: HostResult(h, "unreachable" if h == "macbook-pro" else "ok",
                                     command=None if h == "macbook-pro" else
                                     CommandResult("true", 0, "", "", 0.1), duration=1.234)
                       for h in HOSTS})
    counts = {h: {"ok": 12, "changed": 3, "failed": 0, "skipped": 2} for h in HOSTS}
    text = render(console.recap_table(results, counts))
    assert_readable(text, ["host", "ok", "changed", "failed", "skipped", "unreachable"])
    assert text.lstrip().startswith("recap")
    text = render(console.recap_table(results))
    assert_readable(text, ["host", "status", "rc", "time s"])
    assert re.search(r"^studio1\s+OK\s+0\s+1\.23$", text, re.M), text


def test_skew_table_fits_80_columns():
    expected = {"mlx": "0.29.2", "python": "3.12", "macos_build": "24F74"}
    values = {h: dict(expected) for h in HOSTS}
    values["mini-rack-07"] = {"mlx": "0.28.0", "python": "3.11", "macos_build": "23H420"}
    spec = skew_table(expected, {"mini-rack-07": ["mlx", "python", "macos_build"]}, values)
    text = render(task_table(spec))
    assert_readable(text, ["host", "mlx", "python", "macOS build"])
    assert re.search(r"^mini-rack-07\s+0\.28\.0\s+3\.11\s+23H420\s*$", text, re.M), text


def test_trust_blocks_keep_fingerprints_whole_in_80_columns(tmp_path):
    key = tmp_path / "k"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)],
                   check=True)
    ktype, blob = (tmp_path / "k.pub").read_text().split()[:2]
    pkey = paramiko.PKey.from_type_string(ktype, base64.b64decode(blob))
    checks = {"studio1": HostKeyCheck("studio1", "192.168.100.121", pkey, "new")}
    results = Results({"studio1": HostResult("studio1", "changed"),
                       "mini-rack-07": HostResult("mini-rack-07", "unreachable",
                                                  "192.168.100.123:22: connection refused")})
    text = render(key_blocks(results, checks))
    assert_readable(text, [])
    fingerprint = HostKeyCheck("studio1", "", pkey).fingerprint
    assert text.splitlines() == ["studio1 (192.168.100.121): new",
                                 f"  ssh-ed25519 {fingerprint}",
                                 "mini-rack-07: unreachable",
                                 "  192.168.100.123:22: connection refused"]


def test_a_table_through_a_pipe_is_printed_whole_not_cut_to_80():
    long_host = "a-very-long-mac-name-in-a-rack-of-studios-that-does-not-fit.example.org"
    results = Results({long_host: HostResult(long_host, "ok",
                                             command=CommandResult("true", 0, "", "", 0.1))})
    text = render(console.recap_table(results), width=80, terminal=False)
    assert "…" not in text
    assert re.search(rf"^{re.escape(long_host)}\s+OK\s+0\s", text, re.M), text
    # ...while a terminal of 80 columns folds the name, never cuts it.
    folded = render(console.recap_table(results), width=80, terminal=True)
    assert "…" not in folded and all(len(ln) <= 80 for ln in folded.splitlines())
    rows = folded.splitlines()[3:]  # title, header, rule
    assert "OK" in rows[0].split() and len(rows) > 1, folded
    assert "".join(row.split()[0] for row in rows if row.strip()) == long_host, folded


@pytest.fixture
def pipe_env(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env["MLXOPS_HOME"] = str(tmp_path / "home")
    env["PYTHONPATH"] = str(ROOT)
    return env


def test_cli_plan_through_a_pipe_is_readable(pipe_env):
    proc = subprocess.run([sys.executable, "-m", "mlxops", "plan",
                           str(ROOT / "jobs" / "demo.yml")],
                          capture_output=True, text=True,  # stdout is a pipe, as in `| cat`
                          env=pipe_env, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    assert_readable(proc.stdout, ["host", "mem GB", "ranks", "rank GB", "budget GB",
                                  "micro x acc", "grad ckpt", "fits"])
    assert re.search(r"^localhost\s+\d+\s+3\s+[\d.]+\s+[\d.]+\s+8 x 1\s+off\s+yes\s*$",
                     proc.stdout, re.M), proc.stdout
    assert re.search(r"^chip: \S", proc.stdout, re.M), proc.stdout
    assert "global batch 24 = micro_batch 8 x accumulation 1 x world 3" in proc.stdout
