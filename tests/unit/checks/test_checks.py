"""The readiness checks as data: a host's state in, the one-line finding out.

Each check is a plain function of a host's :class:`NodeState` and the cluster; here the
states are built from recorded facts and node answers, so no host is needed. What the
check sessions do around them (pytest, the table, exit codes) is in test_check_local.py.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from mlxops.checks import (
    NotReady,
    check_cluster,
    check_files,
    check_host,
    check_macos,
    check_resources,
)
from mlxops.checks.cluster import Cluster
from mlxops.checks.state import UNTRUSTED, NodeState
from mlxops.checks.target import load_target
from mlxops.errors import UserError
from mlxops.hostfacts import HostFacts, Interpreter, MacState
from mlxops.node import protocol
from mlxops.readiness import controller_mlx_version
from mlxops.sync import SyncReport
from mlxops.tasks.facts import build_facts, split_sections

DATA = Path(__file__).parents[1] / "data"
GB = 1024**3
PIN = controller_mlx_version()


def write_inventory(tmp_path: Path, hosts: dict, **all_vars) -> Path:
    path = tmp_path / "inventory.yml"
    doc = {"all": {"vars": {"mlxops_root": "/srv/mlxops", **all_vars},
                   "hosts": {name: dict(v) for name, v in hosts.items()}}}
    path.write_text(yaml.safe_dump(doc))
    return path


def write_job(tmp_path: Path, **keys) -> Path:
    path = tmp_path / "job.yml"
    doc = {"name": "tiny", "inventory": "inventory.yml",
           "trainer": {"model": {"dims": 64, "layers": 2, "heads": 4, "vocab_size": 256,
                                 "seq_len": 32}}, **keys}
    # trainer=None: a job without the bundled trainer (a finetune: job)
    path.write_text(yaml.safe_dump({k: v for k, v in doc.items() if v is not None}))
    return path


def linux_facts(ip: str) -> HostFacts:
    facts = HostFacts.from_json(json.loads((DATA / "facts" / "linux_x86_64.json").read_text()))
    facts.python = Interpreter(path="/usr/bin/python3", version="3.11.7", mlx=PIN)
    facts.venv = None
    facts.interfaces = {"eth0": [ip]}
    facts.root = "/srv/mlxops"
    return facts


def darwin_facts() -> HostFacts:
    text = (DATA / "facts" / "darwin_m2_ultra.txt").read_text()
    return build_facts(split_sections(text), "/srv/mlxops")


def ready(**kw) -> protocol.ReadyAnswer:
    return protocol.ReadyAnswer(**{"now": 1000.0, "disk_free": 500 * GB, "ports_busy": [],
                                   "running": [], **kw})


def cluster_of(tmp_path: Path, n: int = 3, job: dict | None = None,
               per_host: dict | None = None, **host_vars) -> Cluster:
    hosts = {f"mac{i}": {"ansible_host": f"10.0.0.{i}", **host_vars} for i in range(1, n + 1)}
    for name, extra in (per_host or {}).items():
        hosts[name].update(extra)
    inv = write_inventory(tmp_path, hosts)
    target = load_target(inv, job_path=write_job(tmp_path, **job) if job is not None else None)
    cluster = Cluster(target, connector=None)
    for host in target.hosts:
        cluster.states[host.name] = NodeState(
            host, facts=linux_facts(host.ip), ready=ready(), clock=(0.01, 0.02),
            code=SyncReport())
    return cluster


def finding(check, *args) -> str:
    with pytest.raises(NotReady) as got:
        check(*args)
    return got.value.line


def test_an_mlx_that_is_not_the_pin_says_both_and_the_fix(tmp_path):
    cluster = cluster_of(tmp_path)
    node = cluster.state("mac2")
    node.facts.python.mlx = "0.31.0"
    assert finding(check_host.check_mlx, node) == \
        f"mac2: mlx 0.31.0, controller {PIN}: run mlxops provision"
    node.facts.python.mlx = None
    assert finding(check_host.check_mlx, node) == \
        f"mac2: mlx not importable by /usr/bin/python3, controller {PIN}: run mlxops provision"
    check_host.check_mlx(cluster.state("mac1"))


def test_the_interpreter_jobs_run_is_the_venv_when_there_is_one(tmp_path):
    cluster = cluster_of(tmp_path, mlxops_mlx_version="0.30.0")
    node = cluster.state("mac1")
    node.facts.venv = Interpreter(path="/srv/mlxops/venv/bin/python", version="3.11.7",
                                  mlx="0.30.0")
    check_host.check_mlx(node)   # the venv has the pin; mlxops_python's mlx does not matter
    node.facts.venv.mlx = "0.29.0"
    assert finding(check_host.check_mlx, node) == \
        "mac1: mlx 0.29.0, mlxops_mlx_version 0.30.0: run mlxops provision"
    node.facts.venv = None
    node.facts.python = Interpreter(path=None, version=None, mlx=None)
    assert "mlxops_python 'python3' not found" in finding(check_host.check_interpreter, node)
    with pytest.raises(pytest.skip.Exception, match="see check_interpreter"):
        check_host.check_mlx(node)


def test_an_untrusted_host_key_fails_check_ssh_with_its_reason(tmp_path):
    cluster = cluster_of(tmp_path)
    node = NodeState(cluster.target.host("mac3"), UNTRUSTED,
                     "unknown host key for 10.0.0.3 (ssh-ed25519 SHA256:x); run 'mlxops trust'")
    assert finding(check_host.check_ssh, node) == (
        "mac3: unknown host key for 10.0.0.3 (ssh-ed25519 SHA256:x); run 'mlxops trust'")
    check_host.check_ssh(cluster.state("mac1"))


def test_env_file_missing_wrong_mode_or_not_what_provision_renders(tmp_path):
    from mlxops.tasks.env import render_env

    cluster = cluster_of(tmp_path)
    node = cluster.state("mac1")
    path = "/srv/mlxops/env.sh"
    want = render_env(node.host, node.facts).encode()
    node.files[path] = (want, 0o600)
    check_files.check_env_file(node)
    node.files[path] = (None, None)
    assert finding(check_files.check_env_file, node) == \
        "mac1: /srv/mlxops/env.sh missing: run mlxops provision"
    node.files[path] = (want, 0o644)
    assert "mode 644, want 600" in finding(check_files.check_env_file, node)
    edited = want.replace(b"OMPI_MCA_btl_tcp_links=4", b"OMPI_MCA_btl_tcp_links=2")
    assert edited != want
    node.files[path] = (edited, 0o600)
    line = finding(check_files.check_env_file, node)
    assert "differs from what provision renders (line" in line and "links=2" not in line
    node.files[path] = "cannot read /srv/mlxops/env.sh: exit 1: Permission denied"
    assert "Permission denied" in finding(check_files.check_env_file, node)


def test_hostfiles_are_the_hostfiles_tasks_for_the_inventory_or_the_checked_hosts(tmp_path):
    from mlxops.tasks.hostfiles import FILE_NAMES, render_all

    cluster = cluster_of(tmp_path)
    node = cluster.state("mac2")
    choices = cluster.target.hostfiles
    assert [which for which, _ in choices] == ["the inventory"]
    for backend, text in choices[0][1].items():
        node.files[f"/srv/mlxops/hostfiles/{FILE_NAMES[backend]}"] = (text.encode(), 0o644)
    check_files.check_hostfiles(node, cluster)
    node.files["/srv/mlxops/hostfiles/mpi.txt"] = (b"10.0.0.9 slots=1\n", 0o644)
    assert finding(check_files.check_hostfiles, node, cluster) == (
        "mac2: /srv/mlxops/hostfiles/mpi.txt does not match the inventory: "
        "run mlxops provision")
    # Provisioned with --limit mac1,mac2 and checked with the same limit: as it should be.
    target = load_target(tmp_path / "inventory.yml", limit="mac1,mac2")
    limited = Cluster(target, connector=None)
    limited.states = dict(cluster.states)
    assert [which for which, _ in target.hostfiles] == ["the inventory", "the checked hosts"]
    for backend, text in render_all(list(target.hosts)).items():
        node.files[f"/srv/mlxops/hostfiles/{FILE_NAMES[backend]}"] = (text.encode(), 0o644)
    check_files.check_hostfiles(node, limited)
    assert "does not match the inventory" in finding(check_files.check_hostfiles, node,
                                                      cluster)


def test_hostfiles_in_a_benchs_order_say_so_and_the_line_that_keeps_them(tmp_path):
    from mlxops import render
    from mlxops.tasks.hostfiles import FILE_NAMES, render_all

    cluster = cluster_of(tmp_path)
    node = cluster.state("mac2")
    hosts = list(cluster.target.inventory.hosts.values())
    # What mlxops bench --apply writes: every hostfile, the hosts in the best ring's order.
    applied = render_all(render.in_order(hosts, ["mac3", "mac1", "mac2"]))
    for backend, text in applied.items():
        node.files[f"/srv/mlxops/hostfiles/{FILE_NAMES[backend]}"] = (text.encode(), 0o644)
    assert finding(check_files.check_hostfiles, node, cluster) == (
        "mac2: /srv/mlxops/hostfiles/ring.json lists the inventory in another order "
        "(mac3, mac1, mac2; mlxops bench --apply?): to keep it, add under all: vars: "
        "mlxops_ring_order: [mac3, mac1, mac2]; else run mlxops provision")
    # A reordered ring.json beside an mpi.txt of something else is just out of date.
    node.files["/srv/mlxops/hostfiles/mpi.txt"] = (b"10.0.0.9 slots=1\n", 0o644)
    assert "does not match the inventory" in finding(check_files.check_hostfiles, node,
                                                      cluster)

    # With that line in the inventory, the same files are what provision renders.
    inv = yaml.safe_load((tmp_path / "inventory.yml").read_text())
    inv["all"]["vars"]["mlxops_ring_order"] = ["mac3", "mac1", "mac2"]
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inv))
    ordered = Cluster(load_target(tmp_path / "inventory.yml"), connector=None)
    ordered.states = dict(cluster.states)
    for backend, text in applied.items():  # as bench --apply left them
        node.files[f"/srv/mlxops/hostfiles/{FILE_NAMES[backend]}"] = (text.encode(), 0o644)
    check_files.check_hostfiles(node, ordered)
    assert [h.name for h in ordered.target.hosts] == ["mac3", "mac1", "mac2"]


def test_synced_code_names_what_differs(tmp_path):
    cluster = cluster_of(tmp_path)
    node = cluster.state("mac1")
    check_files.check_synced_code(node, cluster)
    node.code = SyncReport(changed=["mlxops/trainer/train.py"], deleted=["mlxops/x.py"])
    assert finding(check_files.check_synced_code, node, cluster) == (
        "mac1: /srv/mlxops/code is not the controller's code: 1 changed, 1 extra "
        "(e.g. mlxops/trainer/train.py): run mlxops provision")


def test_ports_leftovers_and_clock_from_the_ready_answer(tmp_path):
    cluster = cluster_of(tmp_path)
    node = cluster.state("mac2")
    assert cluster.target.ports == {"mac1": (32323,), "mac2": (32324,), "mac3": (32325,)}
    check_resources.check_ring_ports(node, cluster)
    check_resources.check_leftover_ranks(node)
    check_resources.check_clock(node)
    node.ready = ready(ports_busy=[32324], running=[
        protocol.RunningRank("tiny", 1, 4242), protocol.RunningRank("tiny", "launcher", 4240),
        protocol.RunningRank("old", 0, 99)])
    assert finding(check_resources.check_ring_ports, node, cluster) == (
        "mac2: ring port 32324 on 10.0.0.2 in use: stop what holds them "
        "(another job? mlxops status)")
    assert finding(check_resources.check_leftover_ranks, node) == (
        "mac2: job tiny: rank 1 (pid 4242), mpirun (pid 4240) still running; job old: "
        "rank 0 (pid 99) still running: mlxops stop tiny; mlxops stop old")
    node.clock = (-3.5, 0.1)
    assert finding(check_resources.check_clock, node).startswith(
        "mac2: clock -3.5 s off the controller's (limit 1 s): turn on network time")
    node.clock = (1.05, 0.1)   # within the round trip's uncertainty
    check_resources.check_clock(node)
    node.ready = "mac2: ready failed: exit 1: No module named mlxops.node"
    assert finding(check_resources.check_clock, node).startswith(
        "mac2: cannot read the node's answer")


def test_disk_and_memory_follow_the_jobs_plan(tmp_path):
    cluster = cluster_of(tmp_path, job={"port": 31000})
    node = cluster.state("mac1")
    assert cluster.target.ports["mac1"] == (31000,)
    check_resources.check_disk(node, cluster)
    check_resources.check_memory(node, cluster)
    node.ready.disk_free = 200 * 1024**2
    assert finding(check_resources.check_disk, node, cluster).startswith(
        "mac1: 0.2 GB free under /srv/mlxops, job.yml needs 1.0 GB (4 checkpoints of")
    node.facts.memory_bytes = 1024**2
    assert "even at micro-batch 1 with gradient checkpointing" in finding(
        check_resources.check_memory, node, cluster)


def _least_memory(job: Path, world: int, per_rank: int) -> int:
    """The fewest bytes of memory in which one rank taking ``per_rank`` sequences a step
    fits (the trainer's own plan, bisected to a KiB)."""
    from mlxops.jobs.spec import load_job
    from mlxops.trainer.plan import plan_memory
    trainer = load_job(job).workload.config
    lo, hi = 1, 64 * GB
    while hi - lo > 1024:
        mid = (lo + hi) // 2
        fits = plan_memory(trainer, mid, world, per_rank=per_rank).fits
        lo, hi = (lo, mid) if fits else (mid, hi)
    return hi


def test_memory_is_planned_with_the_share_balance_gives_the_host(tmp_path):
    trainer = {"model": {"dims": 64, "layers": 2, "heads": 4, "vocab_size": 256,
                         "seq_len": 512}, "train": {"global_batch": 4}}
    cluster = cluster_of(tmp_path, n=2, job={"trainer": trainer,
                                             "balance": {"mac1": 3, "mac2": 1}})
    job = tmp_path / "job.yml"
    # One sequence a step fits in less than three (an accumulation buffer besides); the
    # equal split (2 each) would plan both hosts alike.
    one, three = _least_memory(job, 2, 1), _least_memory(job, 2, 3)
    assert one < three
    for name in ("mac1", "mac2"):
        cluster.state(name).facts.memory_bytes = one
    check_resources.check_memory(cluster.state("mac2"), cluster)
    assert finding(check_resources.check_memory, cluster.state("mac1"), cluster).startswith(
        "mac1: one rank of job.yml needs ")
    assert "1 ranks, 3 sequences a step under balance)" in finding(
        check_resources.check_memory, cluster.state("mac1"), cluster)
    cluster.state("mac1").facts.memory_bytes = three
    check_resources.check_memory(cluster.state("mac1"), cluster)

    # auto: the split is measured at launch, so any rank may take all but one per peer.
    auto = cluster_of(tmp_path, n=2, job={"trainer": trainer, "balance": "auto"})
    for name in ("mac1", "mac2"):
        auto.state(name).facts.memory_bytes = one
        assert "3 sequences a step under balance" in finding(
            check_resources.check_memory, auto.state(name), auto)


def test_macos_settings_as_the_macos_task_would_set_them(tmp_path):
    cluster = cluster_of(tmp_path)
    node = cluster.state("mac1")
    node.facts = darwin_facts()
    want = int(node.facts.memory_bytes * 0.75) // 1024**2
    assert finding(check_macos.check_wired_limit, node, cluster) == (
        f"mac1: iogpu.wired_limit_mb 0, want {want}: run mlxops provision with "
        "ansible_become: true (a reboot resets it)")
    assert finding(check_macos.check_sleep, node, cluster).startswith(
        "mac1: sleeps after 1 min idle: run mlxops provision with ansible_become: true")
    node.facts.macos = MacState(wired_limit_mb=want, sleep=0, thunderbolt_bridge_up=False)
    check_macos.check_wired_limit(node, cluster)
    check_macos.check_sleep(node, cluster)
    # Where they apply: Macs, and hosts not read (their checks must error, not vanish).
    assert check_macos._mac(cluster, node)
    assert not check_macos._mac(cluster, cluster.state("mac2"))
    assert check_macos._mac(cluster, NodeState(node.host, "unreachable", "down"))
    assert not check_macos._mac(cluster, NodeState(node.host, "unreachable", "down",
                                                   cached=linux_facts("10.0.0.1")))


def test_versions_agree_names_the_odd_host_and_leaves_the_mlx_pin_to_check_mlx(tmp_path):
    cluster = cluster_of(tmp_path)
    for name in cluster.states:
        check_cluster.check_versions_agree(cluster.state(name), cluster)
    cluster.state("mac3").facts.python.version = "3.12.1"
    cluster.state("mac2").facts.python.mlx = "0.1.0"   # check_mlx's finding
    assert finding(check_cluster.check_versions_agree, cluster.state("mac3"), cluster) == (
        "mac3: python 3.12, others 3.11: make them agree (mlxops_mlx_version, the Python of "
        "mlxops_python, macOS updates), then run mlxops provision")
    check_cluster.check_versions_agree(cluster.state("mac2"), cluster)


def test_a_pin_that_differs_across_hosts_is_a_version_skew(tmp_path):
    cluster = cluster_of(tmp_path, per_host={"mac3": {"mlxops_mlx_version": "0.31.0"}})
    cluster.state("mac3").facts.python.mlx = "0.31.0"
    check_host.check_mlx(cluster.state("mac3"))
    assert finding(check_cluster.check_versions_agree, cluster.state("mac3"), cluster) \
        .startswith(f"mac3: mlx 0.31.0, others {PIN}")


def test_ring_reach_fails_both_ends_of_a_pair_that_cannot_connect(tmp_path):
    cluster = cluster_of(tmp_path)
    cluster.reached = True
    answers = {
        "mac1": protocol.ReachAnswer([32323], {"mac2": [32324], "mac3": [32325]}, {}),
        "mac2": protocol.ReachAnswer([32324], {"mac1": [32323]},
                                     {"mac3": "10.0.0.3:32325: timed out"}),
        "mac3": protocol.ReachAnswer([32325], {"mac1": [32323], "mac2": [32324]}, {}),
    }
    for name, answer in answers.items():
        cluster.state(name).reach = answer
    check_cluster.check_ring_reach(cluster.state("mac1"), cluster)
    assert finding(check_cluster.check_ring_reach, cluster.state("mac2"), cluster) == (
        "mac2: cannot reach mac3 (10.0.0.3:32325: timed out): let the nodes connect to each "
        "other's mlxops_ip on the ring ports (a firewall?)")
    assert finding(check_cluster.check_ring_reach, cluster.state("mac3"), cluster) == (
        "mac3: mac2 cannot reach it (10.0.0.3:32325: timed out): let the nodes connect to "
        "each other's mlxops_ip on the ring ports (a firewall?)")


def test_mpirun_on_rank_0s_host_and_at_the_same_path_elsewhere(tmp_path):
    cluster = cluster_of(tmp_path, mlxops_backend="mpi")
    assert cluster.target.backend == "mpi" and cluster.target.ports["mac1"] == ()
    for name in cluster.states:
        cluster.state(name).ready = ready(mpirun="/opt/homebrew/bin/mpirun")
    for name in cluster.states:
        check_cluster.check_mpirun(cluster.state(name), cluster)
    cluster.state("mac3").ready = ready(mpirun="/usr/local/bin/mpirun")
    assert finding(check_cluster.check_mpirun, cluster.state("mac3"), cluster) == (
        "mac3: mpirun /usr/local/bin/mpirun, on mac1 (rank 0) /opt/homebrew/bin/mpirun: "
        "install Open MPI at the same path on every node")
    cluster.state("mac1").ready = ready()
    assert finding(check_cluster.check_mpirun, cluster.state("mac1"), cluster).startswith(
        "mac1: mpirun not found")


def test_the_target_is_the_jobs_hosts_narrowed_by_limit_with_the_jobs_ports(tmp_path):
    hosts = {f"mac{i}": {"ansible_host": f"10.0.0.{i}", "mlxops_slots": 2} for i in (1, 2, 3)}
    write_inventory(tmp_path, hosts)
    job = write_job(tmp_path, hosts="all:!mac1", port=30000)
    target = load_target(tmp_path / "inventory.yml", job_path=job, limit="mac3")
    assert target.names == ["mac3"] and target.world == 4
    assert target.ports == {"mac3": (30002, 30003)}   # ranks 2, 3 of the job's placement


def test_hosts_come_from_the_inventory_and_its_patterns(tmp_path):
    hosts = {f"mac{i}": {"ansible_host": f"10.0.0.{i}"} for i in (1, 2, 3)}
    write_inventory(tmp_path, hosts)
    target = load_target(tmp_path / "inventory.yml", limit="mac*:!mac2")
    assert target.names == ["mac1", "mac3"]
    # Without a job, mlx.launch's ports, placed over the checked hosts.
    assert target.ports == {"mac1": (32323,), "mac3": (32324,)}


@pytest.mark.parametrize("change,error", [
    ({"job": {"inventory": "other.yml"}}, "job.yml: inventory: no such file"),
    ({"limit": "mac1", "job": {"hosts": "mac2"}},
     "--limit: 'mac1' selects none of the hosts of job.yml"),
    ({"vars": {"mac2": {"mlxops_backend": "mpi"}}},
     "inventory.yml: mlxops_backend: the selected hosts name different backends "
     "(mac1 ring (unset), mac2 mpi)"),
    ({"limit": "nosuch"}, "--limit: no host or group named 'nosuch'"),
])
def test_bad_input_is_one_line_naming_the_file_and_key(tmp_path, change, error):
    hosts = {"mac1": {}, "mac2": {}}
    for name, extra in change.get("vars", {}).items():
        hosts[name].update(extra)
    write_inventory(tmp_path, hosts)
    job = write_job(tmp_path, **change["job"]) if "job" in change else None
    with pytest.raises(UserError) as got:
        load_target(tmp_path / "inventory.yml", job_path=job, limit=change.get("limit"))
    assert error in str(got.value) and "\n" not in str(got.value)


def test_a_job_of_another_inventory_is_refused(tmp_path):
    write_inventory(tmp_path, {"mac1": {}})
    other = tmp_path / "other"
    other.mkdir()
    write_inventory(other, {"mac1": {}})
    job = write_job(tmp_path, inventory="other/inventory.yml")
    with pytest.raises(UserError, match=r"job.yml: inventory: names .*other/inventory.yml, "
                                        r"not the inventory being checked"):
        load_target(tmp_path / "inventory.yml", job_path=job)


def test_states_are_copied_not_shared_between_hosts(tmp_path):
    # Guard for the tests above: each host's facts are its own record.
    cluster = cluster_of(tmp_path)
    a, b = cluster.state("mac1").facts, cluster.state("mac2").facts
    a.python.mlx = "x"
    assert b.python.mlx == PIN
    assert copy.deepcopy(a) == a


def test_all_sum_fails_every_host_with_the_reason_or_waits_for_the_other_checks(tmp_path):
    cluster = cluster_of(tmp_path)
    cluster.reached = True
    for name in ("mac1", "mac2", "mac3"):
        others = {n: [32323 + int(n[-1]) - 1] for n in ("mac1", "mac2", "mac3") if n != name}
        cluster.state(name).reach = protocol.ReachAnswer([32323 + int(name[-1]) - 1], others, {})
    assert cluster.all_sum_blocker() == ""
    cluster.all_sum = ""                                      # ran, 0 wrong
    check_cluster.check_all_sum(cluster.state("mac2"), cluster)
    cluster.all_sum = "all-reduce failed: rank 2 on mac3 exited with code 1"
    assert finding(check_cluster.check_all_sum, cluster.state("mac1"), cluster) == (
        "mac1: all_sum across the checked hosts' ranks failed: all-reduce failed: rank 2 on "
        "mac3 exited with code 1: run mlxops bench for the links and the all-reduce, "
        "mlxops logs mlxops-bench while it runs")
    # Anything that would make it change a host, or hang, waits for the check that says so.
    cluster.state("mac3").reach = protocol.ReachAnswer([32325], {"mac1": [32323]},
                                                       {"mac2": "timed out"})
    assert cluster.all_sum_blocker() == "mac3 does not reach every peer (check_ring_reach)"
    cluster.state("mac2").code = SyncReport(changed=["mlxops/trainer/train.py"])
    assert cluster.all_sum_blocker() == \
        "the code on mac2 is not current (check_synced_code)"
    cluster.state("mac1").ready = ready(ports_busy=[32323])
    assert cluster.all_sum_blocker() == "ring ports are busy on mac1 (check_ring_ports)"
    cluster.all_sum, cluster.all_sum_skipped = None, cluster.all_sum_blocker()
    with pytest.raises(pytest.skip.Exception, match="all_sum not run: ring ports are busy"):
        check_cluster.check_all_sum(cluster.state("mac2"), cluster)


def test_collectives_fails_the_host_whose_ranks_got_wrong_answers_with_backend_and_mlx(
        tmp_path):
    cluster = cluster_of(tmp_path)
    assert cluster.collectives_ops() == ("all_sum", "all_gather", "send_recv")
    line = ("the ring backend (MLX 0.32.4) returned wrong data: all_gather float32 x 1031: "
            "rank 1 got rank 1's values where rank 0's belong (order wrong)")
    cluster.collectives = {"mac1": [], "mac2": [line.split(": ", 1)[1]], "mac3": []}
    cluster.collectives_line = line
    check_cluster.check_collectives(cluster.state("mac1"), cluster)
    assert finding(check_cluster.check_collectives, cluster.state("mac2"), cluster) == (
        f"mac2: {line} (on this host: all_gather float32 x 1031: rank 1 got rank 1's values "
        "where rank 0's belong (order wrong)): run jobs that use these collectives on "
        "another backend or MLX version (docs/node-protocol.md, Collectives check)")
    cluster.collectives, cluster.collectives_error = None, "the collectives check failed: x"
    assert "the collectives check did not run" in finding(
        check_cluster.check_collectives, cluster.state("mac1"), cluster)
    cluster.collectives_error, cluster.collectives_skipped = "", "mac3 was not read (x)"
    with pytest.raises(pytest.skip.Exception, match="collectives not checked: mac3"):
        check_cluster.check_collectives(cluster.state("mac2"), cluster)
