"""Files from a node as a stream (jobs/download.py over SSHConnection.read_output), on real
sshd nodes: the bash sandbox's and the Mac-like ones (zsh login, BSD tools). The node's
``send`` command runs from the synced code; what comes back is byte for byte what the node
holds, and the controller never holds a file whole (Python's allocations, traced, stay a
fraction of the file's size)."""

from __future__ import annotations

import tracemalloc

import pytest

from mlxops.inventory import load_inventory
from mlxops.jobs.download import download, send_command
from mlxops.node import protocol
from mlxops.node.protocol.send import send_args, send_checkpoint_args
from mlxops.sync import bundle, sync_files

BIG = 48 << 20   # bytes: large beside what the controller may hold of it
PATTERN = bytes(range(256))


@pytest.fixture(params=["sandbox", "mac_sandbox"])
def node(request):
    """``(connection, python, code dir, work dir)`` on the first node, the code synced."""
    box = request.getfixturevalue(request.param)
    connector = request.getfixturevalue("connector")
    host = load_inventory(box.inventory_path).hosts["node1"]
    conn = connector.connect(host)
    home = conn.run("pwd").stdout.strip()
    code, work = f"{home}/.mlxops/code", f"{home}/download-test"
    files, roots, ignore = bundle(None, None)
    sync_files(conn, files, code, roots=roots, ignore=ignore, python=box.python)
    ckpt = f"{work}/run/ckpt/{protocol.checkpoint_name(7)}"
    made = conn.run(
        f"rm -rf {work} && mkdir -p {ckpt} && cd {work} && "
        f"{box.python} -c 'import sys; sys.stdout.buffer.write(bytes(range(256)) * "
        f"{BIG // 256})' > big && printf small > 'a file' && "
        f"for f in {' '.join(protocol.CKPT_FILES)}; do printf x > {ckpt}/$f; done && "
        f"printf '{{\"step\": 7}}' > {ckpt}/{protocol.CKPT_STATE} && "
        f"printf lora > {ckpt}/adapters.safetensors", timeout=60)
    assert made.ok, made.stderr
    yield conn, box.python, code, work
    conn.run(f"rm -rf {work}")


def test_a_directory_comes_back_byte_for_byte_never_whole_in_memory(node, tmp_path):
    conn, python, code, work = node
    tracemalloc.start()
    try:
        got, result = download(conn, send_command(python, code, send_args(work)), tmp_path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.ok, result.stderr
    assert {k: v for k, v in got.answer.files.items() if "/" not in k} == {"a file": 5,
                                                                           "big": BIG}
    assert got.written == got.answer.files
    assert (tmp_path / "a file").read_bytes() == b"small"
    with open(tmp_path / "big", "rb") as handle:
        while chunk := handle.read(1 << 20):
            assert chunk == PATTERN * (len(chunk) // 256)
    assert peak < BIG // 4, f"{peak} bytes of Python memory at most for {BIG} bytes"


def test_the_node_chooses_the_checkpoint_and_says_what_is_missing(node, tmp_path):
    conn, python, code, work = node
    args = send_checkpoint_args(f"{work}/run", protocol.CKPT_DIR, ["adapters.safetensors"])
    got, result = download(conn, send_command(python, code, args), tmp_path)
    assert result.ok and (got.answer.directory, got.answer.step) == ("ckpt/step-00000007", 7)
    assert (tmp_path / "adapters.safetensors").read_bytes() == b"lora"
    args = send_checkpoint_args(f"{work}/run", protocol.BEST_DIR, ["adapters.safetensors"])
    got, result = download(conn, send_command(python, code, args), tmp_path / "none")
    assert result.ok and got.answer.missing == "no complete checkpoint in best/"
