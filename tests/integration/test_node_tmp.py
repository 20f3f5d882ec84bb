"""Nodes that other people use too: another user ran MLX first on the node, so the
temporary directory its sessions get holds their ``mlx/<version>/cpu/`` (root's here,
mode 0755, as MLX leaves it), where our ranks cannot write a kernel's source.

A job's ranks compile in their run's own temporary directory, so the job trains; ranks
told to use the shared one (the user's own ``TMPDIR`` wins) fail at start, and the
controller says each distinct reason once, with the ranks that share it.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import mlx.core as mx
import pytest
import yaml
from job_helpers import inventory_with_slots, run_dir

from mlxops.inventory import load_inventory
from mlxops.jobs.launch import launch
from mlxops.jobs.logs import fetch, prefixed
from mlxops.jobs.record import load_record
from mlxops.jobs.spec import load_job
from mlxops.jobs.status import job_status
from mlxops.jobs.stop import stop_job
from mlxops.jobs.watch import supervise
from mlxops.node.protocol import FAILED, FINISHED
from mlxops.sandbox.kernels import KERNELS, link_node_cache

TRAINER = {
    "model": {"dims": 32, "layers": 1, "heads": 2, "vocab_size": 256, "seq_len": 32},
    "data": {"source": "synthetic", "seed": 0},
    "train": {"steps": 8, "global_batch": 6, "micro_batch": 2, "lr": 3e-3,
              "checkpoint_every": 0, "log_every": 1},
}
COMPILE = ("import mlx.core as mx; f = mx.compile(lambda x: mx.exp(x) * 3 + 1); "
           "mx.eval(f(mx.ones(8)))")


@pytest.fixture
def foreign_tmp():
    """A temporary directory (sticky, world-writable like /tmp) in which another user, root
    here, ran MLX first: ``mlx/<version>/cpu/`` theirs, mode 0755."""
    path = Path(f"/tmp/mlxops-foreign-tmp-{os.getpid()}")
    shutil.rmtree(path, ignore_errors=True)
    theirs = path / "mlx" / mx.__version__ / "cpu"
    theirs.mkdir(parents=True)
    path.chmod(0o1777)
    for d in (theirs, theirs.parent, theirs.parent.parent):
        d.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def write_job(tmp_path: Path, inventory: Path, name: str, hosts: str, **extra) -> Path:
    job = {"name": name, "inventory": str(inventory), "hosts": hosts, "backend": "ring",
           "trainer": TRAINER, **extra}
    path = tmp_path / f"{name}.yml"
    path.write_text(yaml.safe_dump(job))
    return path


def test_a_job_trains_where_another_user_ran_mlx_first(sandbox, tmp_path, connector,
                                                       foreign_tmp):
    nodes = ["node1", "node2"]
    inventory = inventory_with_slots(sandbox, tmp_path, {"node1": 2})
    hosts = load_inventory(inventory).hosts
    rc_files = [sandbox.node_home(n) / ".bashrc" for n in nodes]
    try:
        for rc in rc_files:  # bash reads it for a command sshd runs: the sessions' TMPDIR
            rc.write_text(f"export TMPDIR={foreign_tmp}\n")
        for node in nodes:
            conn = connector.connect(hosts[node])
            assert conn.run('printf %s "$TMPDIR"').stdout == str(foreign_tmp), node
            # What every rank hit before: MLX cannot compile in that directory.
            plain = conn.run(f"{hosts[node].python} -c '{COMPILE}'", timeout=120)
            assert not plain.ok and "No such file or directory" in plain.stdout + plain.stderr

        # A node's first job compiles every kernel (minutes on a busy 2-core machine): no
        # stall restarts meanwhile, and none at all.
        spec = load_job(write_job(tmp_path, inventory, "foreign-tmp", ",".join(nodes),
                                  restart={"max_restarts": 0, "stall_timeout": 600}))
        record = launch(spec, connector)
        final = supervise(record, connector, poll=0.5)
        assert final.state == FINISHED, final.to_dict()
        assert load_record("foreign-tmp").restarts == []
    finally:
        for rc in rc_files:
            rc.unlink(missing_ok=True)

    account = pwd.getpwnam(sandbox.user)
    for node in nodes:
        tmp = run_dir(sandbox, node, "foreign-tmp") / "tmp"
        st = tmp.lstat()
        assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700, node
        assert st.st_uid == account.pw_uid, node
        # Its mlx/ is the node user's kernel cache, <mlxops_root>/cache/mlx (as the node
        # sees its home), where the ranks' kernels are; the sandbox links each node's
        # ~/.mlxops/cache to one directory per node user.
        assert os.readlink(tmp / "mlx") == f"{account.pw_dir}/.mlxops/cache/mlx"
        linked = sandbox.node_home(node) / ".mlxops" / "cache"
        assert linked.resolve() == (KERNELS / sandbox.user).resolve()
    cache = KERNELS / sandbox.user / "mlx"
    assert list((cache / mx.__version__ / "cpu").glob("lib*.so"))
    assert not list((foreign_tmp / "mlx" / mx.__version__ / "cpu").iterdir())


def test_ranks_that_fail_at_start_show_one_line_per_cause(sandbox, tmp_path, connector,
                                                          foreign_tmp):
    """node1 and node2 are told to use the shared directory (``mlxops_env: {TMPDIR}``, the
    user's word wins): their ranks fail at the first compiled step, and node3's and
    node4's then lose their ring peers. Four tracebacks, two causes."""
    doc = yaml.safe_load(sandbox.inventory_path.read_text())
    for node in ("node1", "node2"):
        doc["all"]["children"]["sandbox"]["hosts"][node]["mlxops_env"] = {
            "TMPDIR": str(foreign_tmp)}
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump(doc))
    job = write_job(tmp_path, inventory, "fail-at-start", "node1,node2,node3,node4",
                    restart={"max_restarts": 0, "stall_timeout": 600})
    job_doc = yaml.safe_load(job.read_text())
    job_doc["trainer"]["train"]["global_batch"] = 8
    job.write_text(yaml.safe_dump(job_doc))
    record = launch(load_job(job), connector)
    try:
        deadline = time.monotonic() + 300
        while True:
            status = job_status(record, connector)
            if all(r.state == FAILED for r in status.ranks):
                break
            assert time.monotonic() < deadline, status.to_dict()
            time.sleep(0.5)
    finally:
        stop_job(record, connector, mark_stopped=False)

    logs_text = "\n".join(prefixed(fetch(record, connector, {})))
    assert len(status.failures) == 2, ([f.to_dict() for f in status.failures], logs_text)
    compile_failed, peers_lost = status.failures
    assert compile_failed.ranks == [(0, "node1"), (1, "node2")]
    assert compile_failed.why.startswith(
        "RuntimeError: [Compile::eval_cpu] Failed to compile function ")
    assert compile_failed.why.endswith(": No such file or directory compilation terminated.")
    assert peers_lost.ranks == [(2, "node3"), (3, "node4")]
    assert peers_lost.why.startswith("RuntimeError: [ring]"), peers_lost.why

    # The watchdog's reason: the rank that failed first, its line, who shares it.
    final = supervise(load_record("fail-at-start"), connector, poll=0.5)
    assert final.state == FAILED
    # (which of rank 0 and rank 1 ended first is a matter of timing)
    why = {r.rank: r.failure for r in final.ranks}
    assert final.message in (
        f"gave up after 0 restarts: rank 0 on node1 exited with code 1: {why[0]} "
        "(also node2 r1)",
        f"gave up after 0 restarts: rank 1 on node2 exited with code 1: {why[1]} "
        "(also node1 r0)"), final.message

    # `mlxops status` and `mlxops logs`: each cause once, on one line, with its ranks.
    env = {**os.environ, "COLUMNS": "80"}
    shown = subprocess.run([sys.executable, "-m", "mlxops", "status", "fail-at-start"],
                           capture_output=True, text=True, env=env, timeout=120)
    lines = shown.stdout.splitlines()
    assert f"  node1 r0, node2 r1 failed: {compile_failed.why}" in lines, shown.stdout
    assert f"  node3 r2, node4 r3 failed: {peers_lost.why}" in lines, shown.stdout
    assert shown.stdout.count("Compile::eval_cpu") == 1 + ("Compile::eval_cpu" in
                                                           final.message)
    logs = subprocess.run([sys.executable, "-m", "mlxops", "logs", "fail-at-start"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert logs.stdout.count("Traceback (most recent call last):") == 4
    assert logs.stderr.splitlines() == [
        "why ranks failed:", f"  node1 r0, node2 r1 failed: {compile_failed.why}",
        f"  node3 r2, node4 r3 failed: {peers_lost.why}"]


def test_a_node_whose_kernel_cache_is_open_to_others_is_named_and_not_linked(sandbox, tmp_path):
    """node5's ``~/.mlxops/cache`` is a directory anyone may write to: launch says so, and
    the rank (a ``command:`` job printing its ``TMPDIR``) still runs, in its own."""
    home = sandbox.node_home("node5")
    cache = home / ".mlxops" / "cache"
    account = pwd.getpwnam(sandbox.user)
    try:
        cache.unlink()  # the sandbox's link to the shared cache
        cache.mkdir(mode=0o777)
        cache.chmod(0o777)
        os.chown(cache, account.pw_uid, account.pw_gid)
        job = tmp_path / "job.yml"
        job.write_text(yaml.safe_dump({
            "name": "open-cache", "inventory": str(sandbox.inventory_path), "hosts": "node5",
            "command": ["python", "-c", "import os; print('TMPDIR=' + os.environ['TMPDIR'])"],
            "restart": {"max_restarts": 0}}))
        env = {**os.environ, "COLUMNS": "200"}
        launched = subprocess.run([sys.executable, "-m", "mlxops", "launch", str(job)],
                                  capture_output=True, text=True, env=env, timeout=300)
        assert launched.returncode == 0, launched.stderr
        assert (f"warning: node5: the kernel cache is not used ({account.pw_dir}/.mlxops/cache "
                "is open to others (mode 777))") in launched.stderr
        logs = subprocess.run([sys.executable, "-m", "mlxops", "logs", "open-cache"],
                              capture_output=True, text=True, env=env, timeout=120)
        assert f"TMPDIR={account.pw_dir}/.mlxops/runs/open-cache/tmp" in logs.stdout
        assert not (run_dir(sandbox, "node5", "open-cache") / "tmp" / "mlx").exists()
    finally:
        shutil.rmtree(cache, ignore_errors=True)
        link_node_cache(home, account)
