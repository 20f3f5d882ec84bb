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
from pathlib import Path

import mlx.core as mx
import pytest
import yaml
from job_helpers import inventory_with_slots, run_dir

from mlxops.inventory import load_inventory
from mlxops.jobs.launch import launch
from mlxops.jobs.record import load_record
from mlxops.jobs.spec import load_job
from mlxops.jobs.watch import supervise
from mlxops.node.protocol import FINISHED
from mlxops.sandbox.kernels import KERNELS

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
