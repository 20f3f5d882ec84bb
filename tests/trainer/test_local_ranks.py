"""local_ranks: ring ranks on this machine, as mlx.launch starts them, without its launcher."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from mlxops.devtools.local_ranks import run_ranks
from mlxops.sandbox import nospin

RANK = """
import json, os, sys, time
rank = int(os.environ["MLX_RANK"])
hosts = json.load(open(os.environ["MLX_HOSTFILE"]))
print(json.dumps({"rank": rank, "hosts": hosts, "stdin": sys.stdin.read()}), flush=True)
print(f"rank {rank} says", file=sys.stderr)
mode = sys.argv[1]
if mode == "fail" and rank == 1:
    sys.exit(3)
if mode != "ok":
    time.sleep(60)  # a rank whose peer died waits in a collective forever
"""


def ranks_of(mode: str, ranks: int = 3, timeout: float = 30) -> subprocess.CompletedProcess:
    return run_ranks([sys.executable, "-c", RANK, mode], ranks, timeout=timeout)


def test_every_rank_gets_its_rank_and_one_hostfile_and_no_stdin():
    proc = ranks_of("ok")
    assert proc.returncode == 0
    said = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [s["rank"] for s in said] == [0, 1, 2]  # the output in rank order
    hosts = said[0]["hosts"]
    assert all(s["hosts"] == hosts for s in said)
    assert len(hosts) == 3 and all(len(h) == 1 and h[0].startswith("127.0.0.1:") for h in hosts)
    assert len({h[0] for h in hosts}) == 3
    assert all(s["stdin"] == "" for s in said)
    assert proc.stderr.splitlines() == ["rank 0 says", "rank 1 says", "rank 2 says"]


def test_a_failed_rank_ends_the_run_with_its_code_and_the_others_killed():
    t0 = time.monotonic()
    proc = ranks_of("fail")
    assert proc.returncode == 3
    assert time.monotonic() - t0 < 20  # not the 60 s the others would wait
    assert len(proc.stdout.splitlines()) == 3


def test_a_timeout_kills_every_rank():
    t0 = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        ranks_of("hang", ranks=2, timeout=3)
    assert time.monotonic() - t0 < 15
    left = subprocess.run(["pgrep", "-f", "a rank whose peer died"], capture_output=True)
    assert left.returncode == 1, left.stdout  # no rank left behind


def test_one_rank_is_not_a_ring():
    with pytest.raises(ValueError, match="2 or more ranks"):
        run_ranks(["true"], 1)


def test_a_preload_goes_after_the_environments(tmp_path):
    """``preload`` (the tests' waiting library) follows whatever the environment preloads
    (the OpenBLAS a test gives its ranks stays first), and is alone without one."""
    library = nospin.library(tmp_path)
    if library is None:
        pytest.skip("no C compiler to build the library with")
    show = [sys.executable, "-c", "import os; print(os.environ['LD_PRELOAD'])"]
    first = "/lib/x86_64-linux-gnu/libm.so.6"
    if not os.path.exists(first):
        pytest.skip(f"{first}: not this machine's layout")
    both = run_ranks(show, 2, env={**os.environ, "LD_PRELOAD": first}, preload=library)
    assert both.stdout.splitlines() == [f"{first}:{library}"] * 2, both.stderr
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    assert run_ranks(show, 2, env=env, preload=library).stdout.splitlines() == [library] * 2
