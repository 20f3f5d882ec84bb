"""The mpi launcher (mpirun of one rank script per app context) and mpi rank scripts, as
data, and run by a real sh against a stand-in mpirun that prints the words it gets."""

from __future__ import annotations

import os
import stat
import subprocess
from dataclasses import fields
from pathlib import Path

import pytest
import yaml
from node_answers import Processes, answers, preflight_answer

from mlxops.inventory.model import Host
from mlxops.jobs.placement import (
    NodePaths,
    Rank,
    launcher_script,
    mpirun_argv,
    place_ranks,
    rank_script,
)
from mlxops.jobs.record import HostRecord, JobRecord
from mlxops.jobs.spec import RestartPolicy
from mlxops.jobs.status import LauncherStatus, classify

CASE = yaml.safe_load((Path(__file__).parents[1] / "data" / "jobs" / "mpi_launch.yml").read_text())


def layout():
    hosts = [Host(n, {"ansible_host": h["ip"], "mlxops_slots": h["slots"]})
             for n, h in CASE["hosts"].items()]
    ranks = place_ranks(hosts, 30000)
    scripts = {r.rank: f"{NodePaths(CASE['hosts'][r.host]['root'], 'tiny').run_dir}"
                       f"/rank-{r.rank}.sh" for r in ranks}
    return ranks, scripts


def test_mpirun_runs_each_rank_script_on_its_own_host_in_rank_order():
    ranks, scripts = layout()
    assert mpirun_argv(mpirun=CASE["mpirun"], ranks=ranks, scripts=scripts) == CASE["argv"]


def test_launcher_script_passes_hostile_paths_verbatim_and_records_the_exit_code(tmp_path):
    ranks, scripts = layout()
    root = tmp_path / "root $(touch pwned) 'q'"
    paths = NodePaths(str(root), "tiny")
    run = Path(paths.run_dir)
    run.mkdir(parents=True)
    (root / "env.sh").write_text("export OMPI_MCA_btl_tcp_links=4\n")
    fake = tmp_path / "bin dir" / "mpirun"
    fake.parent.mkdir()
    # Prints each word on its own line, and the env.sh variable it must see; exits 3.
    fake.write_text('#!/bin/sh\nprintf "%s\\n" "$OMPI_MCA_btl_tcp_links" "$PWD" "$@"\nexit 3\n')
    fake.chmod(0o755)
    script = launcher_script(mpirun=str(fake), ranks=ranks, scripts=scripts, paths=paths)
    (run / "launcher.sh").write_text(script)
    out = subprocess.run(["/bin/sh", str(run / "launcher.sh")], capture_output=True, text=True,
                         cwd=tmp_path)
    assert out.returncode == 3
    header, *words = out.stdout.split("\n")[:-1]
    # The log says what runs, quoted as a shell would need it.
    assert header.startswith("mlxops: starting ") and "'/Users/me/ml ops/$(touch pwned)" in header
    assert words[:2] == ["4", str(run)]
    root_flag = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    want = [str(fake.parent.parent), *CASE["argv"][3:]]
    assert words[2:] == root_flag + ["--prefix", *want]
    assert (run / "launcher.exit").read_text() == "3\n"
    assert not (tmp_path / "pwned").exists() and not Path("pwned").exists()


def test_mpi_rank_script_records_its_pid_and_logs_to_its_own_file(tmp_path):
    root = tmp_path / "a root"
    paths = NodePaths(str(root), "tiny")
    run = Path(paths.run_dir)
    run.mkdir(parents=True)
    script = rank_script(env={"X": "y z"}, argv=["sh", "-c", 'echo "out $X $$"; exit 5'],
                         paths=paths, cwd=str(run), rank=2, mpi=True)
    (run / "rank-2.sh").write_text(script)
    proc = subprocess.run(["/bin/sh", str(run / "rank-2.sh")], capture_output=True, text=True)
    assert proc.returncode == 5 and proc.stdout == ""
    pid = int((run / "rank-2.pid").read_text())
    # The attempt's first line names the pid it recorded (the failure reader starts there).
    start, out = (run / "rank-2.log").read_text().splitlines()
    assert start == f"mlxops: started (pid {pid})" and out.startswith("out y z ")
    assert pid > 0 and (run / "rank-2.exit").read_text() == "5\n"


def test_an_mpi_rank_log_is_readable_by_its_owner_only_even_one_an_attempt_left(tmp_path):
    paths = NodePaths(str(tmp_path), "tiny")
    run = Path(paths.run_dir)
    run.mkdir(parents=True)
    (run / "rank-0.log").write_text("the previous attempt's lines\n")
    (run / "rank-0.log").chmod(0o644)
    (run / "rank-0.sh").write_text(rank_script(env={}, argv=["true"], paths=paths,
                                               cwd=str(run), rank=0, mpi=True))
    modes = []
    old_umask = os.umask(0o022)
    try:
        for _ in range(2):  # appended to, then new
            assert subprocess.run(["/bin/sh", str(run / "rank-0.sh")]).returncode == 0
            modes.append(stat.S_IMODE((run / "rank-0.log").stat().st_mode))
            (run / "rank-0.log").unlink()
    finally:
        os.umask(old_umask)
    assert modes == [0o600, 0o600]


STATUS = yaml.safe_load((Path(__file__).parents[1] / "data" / "jobs" / "mpi_status_cases.yml")
                        .read_text())


@pytest.mark.parametrize("name", sorted(STATUS))
def test_classify_an_mpi_job_with_its_launcher(name, tmp_path):
    case = STATUS[name]
    with Processes() as procs:
        got, unreachable = answers(tmp_path, case["hosts"], procs)
    record = JobRecord(
        name="j", job_file="j.yml", inventory="inv.yml", backend="mpi",
        hosts=[HostRecord("a", "/r", "/py"), HostRecord("b", "/r", "/py")],
        ranks=[Rank(0, "a", "1.1.1.1", 1, 0), Rank(1, "a", "1.1.1.1", 2, 1),
               Rank(2, "b", "1.1.1.2", 3, 0)],
        state=case["record_state"], restart=RestartPolicy(stall_timeout=10))
    status = classify(record, got, unreachable)
    assert [r.state for r in status.ranks] == case["ranks"]
    assert status.state == case["job"]
    assert status.problem == case["problem"]
    assert status.to_dict()["launcher"]["host"] == "a"
    # The launcher's status says the same fields whatever its state (docs/formats.md).
    assert set(status.to_dict()["launcher"]) == {f.name for f in fields(LauncherStatus)}


def test_preflight_wants_mpirun_on_the_first_host_and_at_the_same_path_everywhere():
    from mlxops.readiness import HostSaid, mpi_findings

    def said(**mpiruns):
        return {n: HostSaid.from_preflight(n, "j", preflight_answer(mpirun=m))
                for n, m in mpiruns.items()}

    assert [f.line for f in mpi_findings(said(a=None, b="/usr/bin/mpirun"), "a")] == [
        "a: mpirun not found (PATH, /opt/homebrew/bin, /usr/local/bin, /opt/local/bin): "
        "install Open MPI: brew install open-mpi"]
    assert mpi_findings(said(a="/usr/bin/mpirun", b="/usr/bin/mpirun"), "a") == []
    [problem] = mpi_findings(said(a="/opt/homebrew/bin/mpirun", b=None), "a")
    assert problem.line == ("b: mpirun not found, on a (rank 0) /opt/homebrew/bin/mpirun: "
                            "install Open MPI at the same path on every node")
