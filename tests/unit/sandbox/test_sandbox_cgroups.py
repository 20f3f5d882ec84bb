"""The sandbox's CPU quota as the files it writes (on a fake cgroup tree, v1 and v2)."""

from __future__ import annotations

import pytest

from mlxops.errors import MlxopsError
from mlxops.sandbox import cgroups


def test_a_quota_is_a_share_of_a_short_period_in_either_hierarchy(tmp_path, monkeypatch):
    monkeypatch.setattr(cgroups, "ROOT", tmp_path)
    with pytest.raises(MlxopsError, match="no cgroup cpu controller"):
        cgroups.set_quota("node8", [], 0.5)

    (tmp_path / "cpu").mkdir()  # v1: the cpu controller's own mount
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    cgroups.set_quota("node8", [4242], 0.5)
    group = tmp_path / "cpu" / "node8"
    # 20 ms, not the kernel's 100: the node runs a little of every 20 ms, not in bursts.
    assert (group / "cpu.cfs_period_us").read_text() == "20000"
    assert (group / "cpu.cfs_quota_us").read_text() == "10000"
    assert (group / "cgroup.procs").read_text() == "4242"
    cgroups.set_quota("node8", [], 0.01)
    assert (group / "cpu.cfs_quota_us").read_text() == "1000"  # the kernel's 1 ms minimum

    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io\n")  # v2 wins where it has cpu
    (tmp_path / "cgroup.subtree_control").write_text("\n")
    cgroups.set_quota("node7", [], 0.25)
    assert (tmp_path / "node7" / "cpu.max").read_text() == "5000 20000"
    assert (tmp_path / "cgroup.subtree_control").read_text() == "+cpu"
    with pytest.raises(MlxopsError, match="positive fraction"):
        cgroups.set_quota("node7", [], 0)
