"""The optimised BLAS on Linux nodes: what pre-flight finds, and what each rank is given.

The node's search (:mod:`mlxops.node.blas`) runs against stand-in library files; the
rank's environment and start script are the ones launch writes, run by a real ``sh``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from node_answers import preflight_answer

from mlxops import shell
from mlxops.inventory.model import Host
from mlxops.jobs.placement import NodePaths, place_ranks, rank_environment, rank_script
from mlxops.jobs.preflight import HostPrep
from mlxops.jobs.runfiles import run_files
from mlxops.jobs.spec import JobSpec
from mlxops.jobs.workloads.trainer import TrainerWorkload
from mlxops.node import blas, protocol
from mlxops.node import preflight as node_preflight
from mlxops.trainer.config import TrainConfig, TrainerConfig

LIB = "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0"


def elf_like(path: Path, source: str = sys.executable, machine: int | None = None) -> Path:
    """A file with ``source``'s ELF header (or another ``machine``), and nothing else."""
    head = bytearray(Path(source).read_bytes()[:64])
    if machine is not None:
        head[18:20] = machine.to_bytes(2, "little" if head[5] == 1 else "big")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(head))
    return path


# --- the node's search ---------------------------------------------------------------------


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ELF interpreters: Linux")
def test_the_first_loadable_openblas_in_order_of_preference(tmp_path):
    this = blas.elf_kind(sys.executable)
    other = 0xB7 if this[2] != 0xB7 else 0x3E     # aarch64, or x86-64 on an aarch64 machine
    (tmp_path / "a" / "i386").mkdir(parents=True)
    (tmp_path / "a" / "i386" / "libopenblas.so.0").write_text("not ELF")
    elf_like(tmp_path / "a" / "m68k" / "libopenblas.so.0", machine=other)
    second = elf_like(tmp_path / "b" / "libopenblas.so.0")
    third = elf_like(tmp_path / "c" / "libopenblas.so.0")
    globs = (f"{tmp_path}/a/*/libopenblas.so.0", f"{tmp_path}/b/libopenblas.so.0",
             f"{tmp_path}/c/libopenblas.so.0")
    # Not ELF, and ELF for another machine, are passed over; the next place in order wins.
    assert blas.find_openblas(globs, ldconfig=False) == str(second)
    assert blas.find_openblas(globs[2:], ldconfig=False) == str(third)
    assert blas.find_openblas(globs[:1], ldconfig=False) is None
    assert blas.find_openblas(globs, ldconfig=False, interpreter=str(tmp_path / "nope")) \
        is None


def test_the_linkers_cache_is_read_when_the_usual_places_have_none(tmp_path, monkeypatch):
    lib = elf_like(tmp_path / "cached" / "libopenblas.so.0")
    listing = (f"3 libs found in cache `/etc/ld.so.cache'\n"
               f"\tlibopenblas.so.0 (libc6,x86-64) => {lib}\n"
               f"\tlibopenblaso.so.0 (libc6,x86-64) => {tmp_path}/gone.so\n"
               "\tlibm.so.6 (libc6,x86-64) => /lib/libm.so.6\n")
    calls = []

    def run(argv, **kwargs):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, listing, "")

    monkeypatch.setattr(blas.subprocess, "run", run)
    assert blas.ldconfig_paths() == [str(lib), f"{tmp_path}/gone.so"]
    assert blas.find_openblas((f"{tmp_path}/none/*.so",)) == str(lib)
    assert blas.find_openblas((str(lib),)) == str(lib) and len(calls) == 2  # found first


def test_usable_cpus_follow_the_affinity_mask_and_a_cgroup_quota(tmp_path, monkeypatch):
    monkeypatch.setattr(blas.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5, 6, 7},
                        raising=False)
    root = tmp_path / "cgroup"
    leaf = root / "jobs" / "node2"
    leaf.mkdir(parents=True)
    own = tmp_path / "self-cgroup"
    own.write_text("0::/jobs/node2\n")
    assert blas.usable_cpus(str(root), str(own)) == 8            # no cpu.max anywhere
    (leaf / "cpu.max").write_text("max 100000\n")
    (root / "cpu.max").write_text("max 100000\n")
    assert blas.usable_cpus(str(root), str(own)) == 8            # "max": no quota
    (root / "jobs" / "cpu.max").write_text("250000 100000\n")    # an ancestor: 2.5 CPUs
    assert blas.cgroup_quota(str(root), str(own)) == 2.5
    assert blas.usable_cpus(str(root), str(own)) == 3            # rounded up
    (leaf / "cpu.max").write_text("50000 100000\n")              # half a CPU: at least 1
    assert blas.usable_cpus(str(root), str(own)) == 1
    own.write_text("4:memory:/x\n")                              # no cpu controller
    assert blas.usable_cpus(str(root), str(own)) == 8
    assert blas.usable_cpus(str(root), str(tmp_path / "none")) == 8

    # The cpu controller still in the v1 hierarchy (this CI machine's kind): its mount
    # is named after the controllers, the quota is cfs_quota_us / cfs_period_us.
    own.write_text("4:memory:/x\n2:cpu,cpuacct:/sandbox/node8\n1:name=systemd:/\n0::/\n")
    v1 = root / "cpu,cpuacct" / "sandbox" / "node8"
    v1.mkdir(parents=True)
    for where, quota in ((root / "cpu,cpuacct", "-1"), (v1.parent, "-1"), (v1, "8000")):
        (where / "cpu.cfs_quota_us").write_text(quota + "\n")
        (where / "cpu.cfs_period_us").write_text("100000\n")
    assert blas.cgroup_quota(str(root), str(own)) == 0.08
    assert blas.usable_cpus(str(root), str(own)) == 1
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")                # no quota
    assert blas.usable_cpus(str(root), str(own)) == 8


def test_preflight_answers_openblas_only_for_an_elf_interpreter_and_the_cpus(
        tmp_path, monkeypatch):
    # Chosen by what the node has, not by its name: a Mac's interpreter is Mach-O (magic
    # 0xfeedfacf, little-endian), into which no OpenBLAS could be preloaded.
    macho = tmp_path / "python3"
    macho.write_bytes((0xFEEDFACF).to_bytes(4, "little") + bytes(28))
    assert blas.find_openblas(interpreter=str(macho)) is None
    monkeypatch.setattr(node_preflight, "find_openblas", lambda: LIB)
    linux = node_preflight.preflight(tmp_path, ip="", ports=[], mpi=False)
    assert linux.cpus >= 1 and linux.openblas == LIB
    # Both cross the wire; an older node's answer without them still reads.
    line = protocol.answer_line(linux)
    assert protocol.parse_answer(protocol.PREFLIGHT, line) == linux
    old = {k: v for k, v in json.loads(line).items() if k not in ("openblas", "cpus")}
    read = protocol.parse_answer(protocol.PREFLIGHT, json.dumps(old))
    assert (read.openblas, read.cpus) == (None, None)


# --- each rank's environment ---------------------------------------------------------------


def host(name, slots=1):
    return Host(name, {"mlxops_slots": slots, "ansible_host": f"10.0.0.{len(name)}"})


def environments(host_env=None, job_env=None, openblas=LIB, cpus=8):
    ranks = place_ranks([host("a", 3), host("bb", 1)], 30000)
    return [rank_environment(backend="ring", rank=r, ranks=ranks, paths=NodePaths("/r", "j"),
                             host_env=host_env or {}, job_env=job_env or {}, resume=False,
                             openblas=openblas, cpus=cpus) for r in ranks]


def test_each_rank_preloads_openblas_with_its_share_of_the_hosts_cores():
    envs = environments()
    assert [e["LD_PRELOAD"] for e in envs] == [LIB] * 4
    assert all(isinstance(e["LD_PRELOAD"], shell.Prepend) for e in envs)
    # 8 CPUs: 3 ranks on a get 2 threads each, the one rank on bb gets all 8.
    assert [e["OPENBLAS_NUM_THREADS"] for e in envs] == ["2", "2", "2", "8"]
    assert [e["OPENBLAS_NUM_THREADS"] for e in environments(cpus=2)] == ["1", "1", "1", "2"]


def test_idle_blas_threads_sleep_within_a_short_spin_cpus_known_or_not():
    for cpus in (8, None):
        envs = environments(cpus=cpus)
        assert [e["OPENBLAS_THREAD_TIMEOUT"] for e in envs] == [str(blas.THREAD_TIMEOUT)] * 4
        assert all(("OPENBLAS_NUM_THREADS" in e) == bool(cpus) for e in envs)


def test_no_openblas_no_change():
    for env in environments(openblas=None):
        assert not {"LD_PRELOAD", "OPENBLAS_NUM_THREADS", "OPENBLAS_THREAD_TIMEOUT"} & set(env)


def test_the_users_ld_preload_and_threads_win():
    envs = environments(host_env={"OPENBLAS_NUM_THREADS": "3"},
                        job_env={"LD_PRELOAD": "/mine.so", "OPENBLAS_THREAD_TIMEOUT": "28"})
    for env in envs:
        assert (env["OPENBLAS_NUM_THREADS"], env["OPENBLAS_THREAD_TIMEOUT"]) == ("3", "28")
        assert env["LD_PRELOAD"] == "/mine.so" and not isinstance(env["LD_PRELOAD"],
                                                                   shell.Prepend)
    assert [e["LD_PRELOAD"] for e in environments(host_env={"OPENBLAS_NUM_THREADS": "3"})] \
        == [LIB] * 4


def run_script(tmp_path, env, inherited):
    """Run a rank script whose program prints its LD_PRELOAD and OPENBLAS_NUM_THREADS."""
    paths = NodePaths(str(tmp_path / "root"), "j")
    Path(paths.run_dir).mkdir(parents=True)
    script = tmp_path / "rank-0.sh"
    script.write_text(rank_script(env=env, argv=["sh", "-c", "printf '%s|%s' "
                                                 '"$LD_PRELOAD" "$OPENBLAS_NUM_THREADS"'],
                                  paths=paths, cwd=paths.run_dir, rank=0))
    # The stand-in libraries do not exist: the dynamic linker says so on stderr, and goes on.
    proc = subprocess.run(["/bin/sh", str(script)], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", **inherited})
    start, printed = proc.stdout.split("\n", 1)  # the attempt's start line, then the program
    assert start.startswith("mlxops: started (pid ")
    return printed


def test_the_preload_goes_before_what_the_ranks_session_preloads(tmp_path):
    env = environments(openblas="/o b/libopenblas.so.0")[3]
    assert run_script(tmp_path, env, {"LD_PRELOAD": "/session.so"}) == \
        "/o b/libopenblas.so.0:/session.so|8"
    assert run_script(tmp_path / "2", env, {}) == "/o b/libopenblas.so.0|8"
    mine = environments(job_env={"LD_PRELOAD": "/mine.so"})[0]
    assert run_script(tmp_path / "3", mine, {"LD_PRELOAD": "/session.so"}) == "/mine.so|2"


def spec(blas: str = "auto", backend: str = "ring") -> JobSpec:
    return JobSpec(path=Path("/jobs/j.yml"), name="j", inventory=Path("/inv.yml"),
                   backend=backend,
                   workload=TrainerWorkload(TrainerConfig(train=TrainConfig(steps=2))),
                   blas=blas)


def scripts(job: JobSpec, answers: dict[str, dict], hosts) -> dict[str, str]:
    preps = {h.name: HostPrep(h, f"/home/{h.name}/.mlxops", "/py",
                              preflight_answer(**answers[h.name], mpirun="/usr/bin/mpirun",
                                               mpi_libname="libmpi.so.40"))
             for h in hosts}
    ranks = place_ranks(hosts, 30000)
    out = {}
    for prep in preps.values():
        files = run_files(job, prep, ranks, False, None, preps)
        out.update({name: data.decode() for name, data in files.items()
                    if protocol.rank_of_script(name) is not None})
    return out


@pytest.mark.parametrize("backend", ["ring", "mpi"])
def test_launch_writes_it_into_the_rank_scripts_of_linux_nodes_with_openblas(backend):
    hosts = [host("a", 2), host("bb", 1), host("mac", 1)]
    answers = {"a": {"openblas": LIB, "cpus": 4}, "bb": {"openblas": None, "cpus": 4},
               "mac": {"system": "Darwin", "cpus": 10}}
    got = scripts(spec(backend=backend), answers, hosts)
    preload = f"export LD_PRELOAD={LIB}" + "${LD_PRELOAD:+\":$LD_PRELOAD\"}"
    for rank in (0, 1):
        assert preload in got[f"rank-{rank}.sh"].splitlines()
        assert "export OPENBLAS_NUM_THREADS=2" in got[f"rank-{rank}.sh"].splitlines()
    for rank in (2, 3):      # no OpenBLAS there; macOS
        assert "LD_PRELOAD" not in got[f"rank-{rank}.sh"]
        assert "OPENBLAS_NUM_THREADS" not in got[f"rank-{rank}.sh"]
    off = scripts(spec("off", backend), answers, hosts)
    assert not any("LD_PRELOAD" in s or "OPENBLAS" in s for s in off.values())


def test_a_local_host_runs_the_trainer_with_it_too():
    local = Host("localhost", {"ansible_connection": "local", "mlxops_slots": 3})
    got = scripts(spec(), {"localhost": {"openblas": LIB, "cpus": 2}}, [local])
    assert sorted(got) == ["rank-0.sh", "rank-1.sh", "rank-2.sh"]
    for text in got.values():
        assert "-m mlxops.trainer --config" in text
        assert "export OPENBLAS_NUM_THREADS=1" in text.splitlines()
        assert f"export LD_PRELOAD={LIB}" in text
