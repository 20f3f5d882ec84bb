"""A rank's idle OpenBLAS threads sleep: with the thread settings mlxops gives ranks
(``mlxops.node.blas.thread_env``), a process that waits after a matmul spends almost no
CPU waiting. At OpenBLAS's own default its second thread spins ~0.1 s after every call,
so a rank that computes a step and then waits for its peers kept a core busy throughout
(benchmarks/blas_idle.py: 1.02 CPU-s per second against 0.04, 2 threads).

A real process with the machine's OpenBLAS preloaded, like the multi-process trainer
tests (docs/testing.md, "Where a test lives")."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from trainer_procs import PY

from mlxops.node.blas import find_openblas, thread_env

OPENBLAS = find_openblas() if sys.platform.startswith("linux") else None

WAIT_AFTER_A_MATMUL = """
import json, resource, time
import mlx.core as mx
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
a = mx.random.normal((256, 256))
spent = 0.0
for _ in range(10):
    mx.eval(a @ a)            # both threads work: 256^3 is over OpenBLAS's threading bar
    before = cpu()
    time.sleep(0.1)           # the wait for the peers
    spent += cpu() - before
print(json.dumps({"waiting_cpu": spent}))
"""


@pytest.mark.skipif(OPENBLAS is None, reason="no OpenBLAS on this machine to preload "
                    "(Debian, Ubuntu: apt-get install libopenblas0-pthread)")
def test_two_blas_threads_sleep_through_a_ranks_waits():
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENBLAS_")}
    env.update(LD_PRELOAD=OPENBLAS, **thread_env(cpus=2, ranks_here=1))
    assert env["OPENBLAS_NUM_THREADS"] == "2"
    done = subprocess.run([PY, "-c", WAIT_AFTER_A_MATMUL], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    # 1 s of waits: a spinning thread would spend most of it (~0.1 s after each call).
    assert json.loads(done.stdout)["waiting_cpu"] < 0.25, done.stdout
