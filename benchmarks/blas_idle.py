"""OpenBLAS's idle threads in a rank that waits for its peers: CPU and speed, mlxops'
settings against OpenBLAS's own.

A rank computes a step, then waits (the all-reduce, its next batch). mlx.launch with an
OpenBLAS preloaded leaves OpenBLAS's default: after each call its helper threads spin
2**28 cycles (~0.1 s) before they sleep. mlxops sets ``OPENBLAS_THREAD_TIMEOUT`` (mlxops/
node/blas.py, ``thread_env``). Two figures per setting, each in a fresh process:

* **waiting**: ``--steps`` matmuls of ``--n`` x ``--n``, each followed by a ``--wait-ms``
  sleep; the process's CPU-s (all its threads) over the loop's wall seconds. The floor is
  the matmuls' own compute.
* **busy**: the median of ``--repeat`` rounds of 50 back-to-back 512 x 512 matmuls: the
  short spin must cost no speed within a step.

Linux with an OpenBLAS only (macOS ranks use Accelerate). Both settings get the same
``OPENBLAS_NUM_THREADS`` (``--threads``, default: this machine's usable CPUs).

    .venv/bin/python benchmarks/blas_idle.py [--threads 2] [--steps 100] [--wait-ms 20]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mlxops.node.blas import find_openblas, thread_env, usable_cpus  # noqa: E402

PROBE = """
import json, resource, statistics, sys, time
import mlx.core as mx
n, steps, wait, repeat = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
a = mx.random.normal((n, n)); b = mx.random.normal((n, n)); mx.eval(a @ b)
c0, t0 = cpu(), time.perf_counter()
for _ in range(steps):
    mx.eval(a @ b)
    time.sleep(wait)
waiting = (cpu() - c0) / (time.perf_counter() - t0)
a = mx.random.normal((512, 512)); b = mx.random.normal((512, 512)); mx.eval(a @ b)
rounds = []
for _ in range(repeat):
    t = time.perf_counter()
    for _ in range(50):
        mx.eval(a @ b)
    rounds.append(time.perf_counter() - t)
    time.sleep(0.01)
print(json.dumps({"waiting": waiting, "busy_ms": statistics.median(rounds) * 1000}))
"""


def measure(env: dict[str, str], args: argparse.Namespace) -> dict[str, float]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OPENBLAS_")}
    out = subprocess.run([sys.executable, "-c", PROBE, str(args.n), str(args.steps),
                          str(args.wait_ms / 1000), str(args.repeat)],
                         env={**clean, **env}, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=usable_cpus())
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--wait-ms", type=float, default=20.0)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    library = find_openblas()
    if library is None:
        sys.exit("no OpenBLAS on this machine (Debian: apt-get install libopenblas0-pthread)")
    threads = {"OPENBLAS_NUM_THREADS": str(args.threads)}
    settings = {
        "OpenBLAS's default (mlx.launch)": {"LD_PRELOAD": library, **threads},
        "mlxops (OPENBLAS_THREAD_TIMEOUT)": {"LD_PRELOAD": library,
                                             **thread_env(args.threads, 1)},
    }
    print(f"{library}, {args.threads} threads; waiting: {args.steps} x ({args.n}^3 matmul "
          f"+ {args.wait_ms:g} ms); busy: 50 x 512^3 back to back, median of {args.repeat}")
    print(f"{'setting':34s} {'waiting CPU-s/s':>16s} {'busy ms':>9s}")
    got = {name: measure(env, args) for name, env in settings.items()}
    for name, fig in got.items():
        print(f"{name:34s} {fig['waiting']:16.3f} {fig['busy_ms']:9.1f}")
    default, ours = got.values()
    print(f"ratio mlxops / default: waiting CPU {ours['waiting'] / default['waiting']:.3f}, "
          f"busy time {ours['busy_ms'] / default['busy_ms']:.3f}")


if __name__ == "__main__":
    main()
