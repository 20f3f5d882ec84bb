"""Rendering: hostfiles and env.sh from an inventory, compared with data files."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from mlxops import render
from mlxops.errors import UserError
from mlxops.inventory import Host, load_inventory

DATA = Path(__file__).parent / "data" / "render"


@pytest.fixture(scope="module")
def hosts():
    return load_inventory(DATA / "cluster.yml").select(None)


def test_ring_hostfile_matches_data(hosts):
    text = render.launch_hostfile(hosts, "ring")
    assert text == (DATA / "cluster.ring.json").read_text()
    data = json.loads(text)
    assert data["backend"] == "ring"
    # one entry per rank: studio1 has two slots
    assert [h["ssh"] for h in data["hosts"]] == [
        "mlx@192.168.1.21", "mlx@192.168.1.21", "mlx@192.168.1.22", "mini1"]
    assert all(h["rdma"] == [] and len(h["ips"]) == 1 for h in data["hosts"])
    # only what every host shares goes to envs (GREETING differs on mini1)
    assert data["envs"] == ["TOKENIZERS_PARALLELISM=false", "MLX_METAL_FAST_SYNCH=1"]


def test_mpi_hostfile_matches_data(hosts):
    assert render.mpi_hostfile(hosts) == (DATA / "cluster.mpi.txt").read_text()


def test_env_file_matches_data(hosts):
    env = render.host_environment(hosts[0], "bridge0")
    assert render.env_file(env) == (DATA / "cluster.studio1.env.sh").read_text()
    assert render.host_environment(hosts[1], None)["OMPI_MCA_btl_tcp_links"] == "8"


def test_mpi_backend_envs_only_shared_values(hosts):
    data = json.loads(render.launch_hostfile(hosts, "mpi"))
    assert not any(e.startswith("OMPI_MCA_btl_tcp_links=") for e in data["envs"])  # 4 vs 8
    same = [Host(n, {"mlxops_btl_tcp_if_include": "en5"}) for n in ("a", "b")]
    envs = render.launch_envs(same, "mpi")
    assert envs == ["OMPI_MCA_btl_tcp_links=4", "OMPI_MCA_btl_tcp_if_include=en5"]
    assert render.launch_envs(same, "ring") == []  # fast synch unset: never a silent default


def test_fast_synch_must_agree():
    hosts = [Host("a", {"mlxops_metal_fast_synch": 1}), Host("b", {})]
    with pytest.raises(UserError, match="mlxops_metal_fast_synch"):
        render.launch_envs(hosts, "ring")


def test_local_host_is_loopback():
    h = Host("localhost", {"ansible_connection": "local", "mlxops_slots": 2})
    data = json.loads(render.launch_hostfile([h]))
    assert data["hosts"] == [{"ssh": "127.0.0.1", "ips": ["127.0.0.1"], "rdma": []}] * 2


def _mesh(names, devices):
    return [Host(n, {"ansible_host": f"10.0.0.{i + 1}",
                     "mlxops_rdma": {p: devices(n, p) for p in names if p != n}})
            for i, n in enumerate(names)]


def test_jaccl_rdma_matrix():
    hosts = _mesh(["m1", "m2", "m3"], lambda a, b: f"rdma_{a}_{b}")
    data = json.loads(render.launch_hostfile(hosts, "jaccl"))
    rows = [h["rdma"] for h in data["hosts"]]
    assert rows[0] == [None, "rdma_m1_m2", "rdma_m1_m3"]
    assert rows[2] == ["rdma_m3_m1", "rdma_m3_m2", None]
    assert all(rows[i][i] is None for i in range(3))


def test_jaccl_missing_device_and_slots():
    hosts = _mesh(["m1", "m2", "m3", "m4"], lambda a, b: "rdma_en3")
    del hosts[0].vars["mlxops_rdma"]["m3"]  # m1-m3 are not ring neighbours of 4
    render.launch_hostfile(hosts, "jaccl-ring")
    with pytest.raises(UserError, match="m1.mlxops_rdma.m3"):
        render.launch_hostfile(hosts, "jaccl")
    two = [Host("m1", {"mlxops_slots": 2, "mlxops_rdma": {}})]
    with pytest.raises(UserError, match="mlxops_slots"):
        render.launch_hostfile(two, "jaccl")


def test_hostile_names_stay_json():
    # (an address cannot hold quotes since the inventory checks it; a user still may)
    h = Host('we"ird\n', {"ansible_host": "a-b.c", "ansible_user": 'u"</script>\\'})
    data = json.loads(render.launch_hostfile([h]))
    assert data["hosts"][0]["ssh"] == 'u"</script>\\@a-b.c'


def test_interface_for():
    ifs = {"lo0": ["127.0.0.1", "::1"], "en0": ["192.168.1.10/24"], "en5": ["fe80::1%en5"]}
    assert render.interface_for("192.168.1.10", ifs) == "en0"
    assert render.interface_for("fe80::1", ifs) == "en5"
    assert render.interface_for("10.9.9.9", ifs) is None
    assert render.interface_for("mini1.local", ifs) is None


HOSTILE = {
    "SUBST": "$(touch {marker})",
    "BACKTICK": "`touch {marker}`",
    "QUOTES": "it's \"quoted\" \\ back",
    "NEWLINE": "line1\nline2; touch {marker}",
    "SEMI": "; touch {marker} ;",
    "DOLLAR": "$HOME ${{PATH}} $$",
    "EMPTY": "",
}


def test_env_file_hostile_values_are_data(tmp_path):
    marker = tmp_path / "pwned"
    env = {k: v.format(marker=marker) for k, v in HOSTILE.items()}
    path = tmp_path / "env.sh"
    path.write_text(render.env_file(env))
    script = ". ./env.sh && " + " && ".join(
        f'printf "%s\\0" "${name}"' for name in env)
    out = subprocess.run(["sh", "-c", script], cwd=tmp_path, capture_output=True, check=True)
    assert out.stdout.split(b"\0")[:-1] == [v.encode() for v in env.values()]
    assert not marker.exists()


def test_env_file_rejects_bad_names():
    with pytest.raises(ValueError):
        render.env_file({"A;touch x": "1"})


def test_cli_hostfile(tmp_path):
    from click.testing import CliRunner

    from mlxops.cli import cli

    inv = str(DATA / "cluster.yml")
    runner = CliRunner()
    out = tmp_path / "hf.json"
    res = runner.invoke(cli, ["hostfile", inv, "-o", str(out)])
    assert res.exit_code == 0 and res.output == ""
    assert out.read_text() == (DATA / "cluster.ring.json").read_text()
    res = runner.invoke(cli, ["hostfile", inv, "--backend", "mpi", "--limit", "studio*"])
    assert res.exit_code == 0
    assert res.output.splitlines()[1:] == ["mlx@192.168.1.21 slots=2", "mlx@192.168.1.22 slots=1"]
    res = runner.invoke(cli, ["hostfile", inv, "--backend", "jaccl"])
    assert res.exit_code == 2 and "mlxops_slots" in res.output  # studio1 has 2 slots
