"""The library sandbox nodes preload (mlxops/sandbox/nospin.c): built from the shipped
source into the cache once, and in a process that loads it a ``recv`` on a non-blocking
socket with nothing to read waits for the socket (at most 1 ms) before it says EAGAIN,
where MLX's ring thread would otherwise call again at once; data that is there comes at
once, and a caller that asks ``MSG_DONTWAIT`` is never made to wait."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from mlxops.sandbox import nospin

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                reason="no C compiler to build the library with")

#: Counts the recv calls a thread makes in 0.2 s on an empty non-blocking socket (flags 0,
#: as MLX's ring makes them, then MSG_DONTWAIT), and reads bytes that are there.
PROBE = """
import json, socket, time
a, b = socket.socketpair()
a.setblocking(False)
def spin(flags):
    n, end = 0, time.monotonic() + 0.2
    while time.monotonic() < end:
        try:
            a.recv(16, flags)
        except BlockingIOError:
            n += 1
    return n
waiting, dontwait = spin(0), spin(socket.MSG_DONTWAIT)
b.send(b"ring")
print(json.dumps({"waiting": waiting, "dontwait": dontwait, "data": a.recv(16).decode()}))
"""


def probe(preload: str | None) -> dict:
    env = {"PATH": "/usr/bin:/bin", **({"LD_PRELOAD": preload} if preload else {})}
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         env=env, timeout=60, check=True)
    return json.loads(out.stdout)


def test_built_once_into_the_cache(tmp_path):
    built = nospin.library(tmp_path)
    assert built is not None and built.startswith(str(tmp_path))
    assert nospin.library(tmp_path) == built  # the source's hash names it: not rebuilt
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".so"] == [built.rsplit("/", 1)[1]]


def test_an_empty_nonblocking_recv_waits_for_the_socket(tmp_path):
    loaded = probe(nospin.library(tmp_path))
    # At most 1 ms a call: ~200 calls in 0.2 s (fewer on a busy machine, never more).
    assert loaded["waiting"] <= 400, loaded
    assert loaded["data"] == "ring"
    # MSG_DONTWAIT asks not to wait: such calls are not made to (many more in the time).
    assert loaded["dontwait"] > 5 * loaded["waiting"], loaded
    bare = probe(None)
    assert bare["waiting"] > 5 * loaded["waiting"], (bare, loaded)
