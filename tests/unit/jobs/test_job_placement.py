"""Rank placement, the environment each rank gets, and its start script (run by a real sh)."""

from __future__ import annotations

import json
import subprocess

from mlxops.inventory.model import Host
from mlxops.jobs.placement import (
    NodePaths,
    place_ranks,
    rank_environment,
    rank_script,
    ring_hostfile,
)


def host(name, slots=1, ip=None):
    vars_ = {"mlxops_slots": slots, "ansible_host": ip or f"10.0.0.{len(name)}"}
    return Host(name, vars_)


def test_ranks_follow_inventory_order_and_slots_with_consecutive_ports():
    ranks = place_ranks([host("a", 2, "10.0.0.1"), host("b", 1, "10.0.0.2")], 30000)
    assert [(r.rank, r.host, r.port, r.local_rank) for r in ranks] == [
        (0, "a", 30000, 0), (1, "a", 30001, 1), (2, "b", 30002, 0)]
    # MLX_HOSTFILE for ring: one list per rank, like mlx.launch writes it.
    assert json.loads(ring_hostfile(ranks)) == [
        ["10.0.0.1:30000"], ["10.0.0.1:30001"], ["10.0.0.2:30002"]]


def test_ring_environment_is_what_mlx_launch_exports_plus_ours():
    ranks = place_ranks([host("a", 2), host("b")], 30000)
    paths = NodePaths("/home/u/.mlxops", "tiny")
    env = rank_environment(backend="ring", rank=ranks[1], ranks=ranks, paths=paths,
                           host_env={"A": "host", "MLX_RANK": "9"}, job_env={"A": "job"},
                           resume=True)
    assert env["MLX_RANK"] == "1"  # ours win over anything a user set
    assert env["MLX_HOSTFILE"] == "/home/u/.mlxops/runs/tiny/hostfile.json"
    assert env["A"] == "job"
    assert (env["MLXOPS_WORLD_SIZE"], env["MLXOPS_LOCAL_RANK"]) == ("3", "1")
    assert env["MLXOPS_RESUME"] == "1"
    assert env["MLXOPS_HOST"] == "a"  # the inventory name (balance: auto's calibration)


def test_jaccl_s_coordinator_is_on_the_management_address_apart_from_the_data_plane():
    """SSH and the coordinator go to ansible_host; the ring and jaccl's data to mlxops_ip
    (docs/inventory.md). A management name the nodes may not resolve (an ssh_config
    alias) leaves the coordinator on the data address."""
    lan = Host("a", {"ansible_host": "192.168.1.21", "mlxops_ip": "10.0.0.1"})
    alias = Host("a", {"mlxops_ip": "10.0.0.1"})   # ansible_host: the name "a"
    other = Host("b", {"ansible_host": "192.168.1.22", "mlxops_ip": "10.0.0.2"})
    paths = NodePaths("/r", "j")
    for first, want in ((lan, "192.168.1.21:30000"), (alias, "10.0.0.1:30000")):
        ranks = place_ranks([first, other], 30000)
        assert ranks[0].ip == "10.0.0.1" and ranks[1].ip == "10.0.0.2"   # the data plane
        env = rank_environment(backend="jaccl", rank=ranks[1], ranks=ranks, paths=paths,
                               host_env={}, job_env={}, resume=False)
        assert env["MLX_JACCL_COORDINATOR"] == want
    ring = rank_environment(backend="ring", rank=ranks[1], ranks=ranks, paths=paths,
                            host_env={}, job_env={}, resume=False)
    assert "MLX_JACCL_COORDINATOR" not in ring


def test_jaccl_environment_names_the_coordinator_and_devices():
    ranks = place_ranks([host("a", ip="10.0.0.1"), host("b", ip="10.0.0.2")], 30000)
    paths = NodePaths("/r", "j")
    env = rank_environment(backend="jaccl-ring", rank=ranks[1], ranks=ranks, paths=paths,
                           host_env={}, job_env={}, resume=False)
    assert env["MLX_JACCL_COORDINATOR"] == "10.0.0.1:30000"
    assert env["MLX_IBV_DEVICES"] == "/r/runs/j/ibv_devices.json"
    assert env["MLX_JACCL_RING"] == "1"
    assert "MLX_HOSTFILE" not in env


def test_a_single_rank_gets_no_hostfile():
    ranks = place_ranks([host("a")], 30000)
    env = rank_environment(backend="ring", rank=ranks[0], ranks=ranks, paths=NodePaths("/r", "j"),
                           host_env={}, job_env={}, resume=False)
    assert "MLX_HOSTFILE" not in env and env["MLXOPS_WORLD_SIZE"] == "1"


def test_rank_script_runs_with_hostile_values_verbatim_and_records_the_exit_code(tmp_path):
    root = tmp_path / "root dir"
    paths = NodePaths(str(root), "job")
    run = root / "runs" / "job"
    run.mkdir(parents=True)
    (root / "env.sh").write_text("export FROM_ENV_SH='managed'\n")
    canary = tmp_path / "pwned"
    hostile = f"$(touch {canary}); `touch {canary}`; ' \" \n"
    script = rank_script(
        env={"HOSTILE": hostile}, paths=paths, cwd=str(run), rank=0,
        argv=["sh", "-c", 'printf "%s|%s|%s" "$HOSTILE" "$FROM_ENV_SH" "$1"; exit 7', "sh",
              hostile])
    (run / "rank-0.sh").write_text(script)
    out = subprocess.run(["/bin/sh", str(run / "rank-0.sh")], capture_output=True, text=True)
    assert out.returncode == 7
    start, program = out.stdout.split("\n", 1)  # the attempt's first line, then the program
    assert start.startswith("mlxops: started (pid ")
    assert program == f"{hostile}|managed|{hostile}"
    assert (run / "rank-0.exit").read_text().strip() == "7"
    assert not canary.exists()


def test_mpi_rank_environment_leaves_rank_numbers_to_mpi():
    ranks = place_ranks([host("a", 2), host("b")], 30000)
    env = rank_environment(backend="mpi", rank=ranks[2], ranks=ranks,
                           paths=NodePaths("/r", "j"), host_env={"MLX_RANK": "7"}, job_env={},
                           resume=False, mpi_env={"MLX_MPI_LIBNAME": "libmpi.so.40"})
    assert "MLX_RANK" not in env and "MLX_HOSTFILE" not in env
    assert env["MLXOPS_BACKEND"] == "mpi"
    assert (env["MLXOPS_WORLD_SIZE"], env["MLXOPS_LOCAL_RANK"]) == ("3", "0")
    assert env["MLX_MPI_LIBNAME"] == "libmpi.so.40"


def test_mpi_environment_from_the_launcher_node_is_what_mlx_launch_sets():
    from node_answers import preflight_answer

    from mlxops.jobs.runfiles import mpi_environment

    def launcher(**answer):
        return preflight_answer(**answer)

    assert mpi_environment(launcher(mpirun="/usr/bin/mpirun", mpi_libname=None)) == {}
    assert mpi_environment(launcher(mpirun="/usr/bin/mpirun", mpi_libname="libmpi.so.40",
                                    system="Linux")) == {"MLX_MPI_LIBNAME": "libmpi.so.40"}
    assert mpi_environment(launcher(mpirun="/opt/homebrew/bin/mpirun", system="Darwin",
                           mpi_libname="/opt/homebrew/opt/open-mpi/lib/libmpi.40.dylib")) == {
        "MLX_MPI_LIBNAME": "/opt/homebrew/opt/open-mpi/lib/libmpi.40.dylib",
        "DYLD_LIBRARY_PATH": "/opt/homebrew/lib"}
