"""Why the out-of-memory back-off is tested with a simulated failure here.

Metal's and CUDA's allocators raise ``[malloc] Unable to allocate N bytes`` when a buffer
cannot be had, and the trainer backs off from that (trainer/step.py; the tests in
test_multiprocess.py raise the same message through ``MLXOPS_TRAINER_FAKE_OOM``). MLX's
CPU build cannot raise it: its allocator takes what ``malloc`` returns without checking
it, so an allocation beyond the process's address space leaves a null buffer and the first
kernel that writes to it kills the process (mlx/backend/no_gpu/allocator.cpp). Its memory
limit (``mx.set_memory_limit``) is recorded, not enforced. This test holds that: if an MLX
update makes the CPU build raise, it fails, and the back-off can be tested with a real
allocation failure.
"""

from __future__ import annotations

import resource
import signal
import subprocess
import sys

import pytest

PROGRAM = """
import mlx.core as mx
print("imported", flush=True)
mx.set_memory_limit(1 << 20)
small = mx.ones((1 << 20,))          # 4 MiB: over the 1 MiB limit, allocated all the same
mx.eval(small)
print("over the limit", small.nbytes, flush=True)
try:
    big = mx.ones((512, 1024, 1024))  # 2 GiB, beyond the 1 GiB address space
    mx.eval(big)
    print("allocated", big.nbytes, flush=True)
except Exception as e:
    print("raised", type(e).__name__, e, flush=True)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MLX's CPU build on Linux")
def test_the_cpu_build_dies_instead_of_raising_out_of_memory():
    def one_gib_of_address_space() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True,
                          preexec_fn=one_gib_of_address_space, timeout=120)
    assert "over the limit 4194304" in done.stdout, done.stdout + done.stderr
    assert "raised" not in done.stdout, (
        f"MLX's CPU build now raises on a failed allocation ({done.stdout.strip()!r}): test "
        "the out-of-memory back-off with a real one, and say so in the README")
    assert done.returncode == -signal.SIGSEGV, (done.returncode, done.stdout, done.stderr)
