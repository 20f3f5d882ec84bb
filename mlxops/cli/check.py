"""``mlxops check INVENTORY [CHECK_DIR...]``: is the cluster ready to train?

Everything given is validated before any host is contacted; then the readiness checks
(and the user's own check directories) run in one pytest session (:mod:`mlxops.checks`).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from mlxops import console
from mlxops.cli.options import (
    connect_options,
    forks_option,
    inventory_argument,
    json_option,
    limit_option,
)
from mlxops.errors import bad_input


@click.command("check")
@inventory_argument
@limit_option
@click.option("--job", "job_path", type=click.Path(dir_okay=False), metavar="JOB",
              help="Check for this job: its hosts, backend and ports; disk and memory "
                   "for its plan.")
@click.option("--junitxml", type=click.Path(dir_okay=False), metavar="PATH",
              help="Also write the results as JUnit XML (one testcase per host per check).")
@click.option("--wait", type=click.FloatRange(0, None), default=0, metavar="SECONDS",
              help="Check again until everything passes or SECONDS have gone by.")
@forks_option
@json_option
@connect_options
@click.argument("check_dirs", nargs=-1, type=click.Path(), metavar="[CHECK_DIR]...")
def command(inventory, limit, job_path, junitxml, wait, forks, as_json, connect, check_dirs):
    """Check that every selected host is ready to train, and print a host x check table.

    Per host: SSH with a verified host key, the interpreter and the pinned mlx, env.sh,
    the hostfiles and the synced code as provision makes them, disk and memory for --job,
    ring ports free, no rank of any job left, the clock, and on macOS the wired limit,
    sleep and, for jaccl, RDMA over Thunderbolt. Across hosts: the same versions, every
    pair reaching the other on the ring ports, mpirun at the same path (mpi). CHECK_DIRs:
    your own checks (check_*.py or test_*.py, pytest with testinfra's `host` fixture),
    run in the same session.

    Exit 0 all passed, 1 a check failed, 2 bad input (nothing contacted), 3 a host
    unreachable.

    \b
    Example:
      mlxops check inventory.yml --job job.yml --junitxml check.xml
    """
    # Here, not at the top: pytest and testinfra load only when checks run, not with
    # every mlxops command.
    from mlxops.checks.run import run_checks
    from mlxops.checks.target import load_target

    for directory in check_dirs:
        if not Path(directory).is_dir():
            raise bad_input(directory, None, "no such check directory")
    target = load_target(inventory, limit=limit, job_path=job_path, forks=forks,
                         options=connect)

    def on_retry(report, pause: float) -> None:
        left = len({r.host for r in report.results if r.outcome not in ("passed", "skipped")})
        console.err.print(f"mlxops check: not ready ({left} hosts); checking again in "
                          f"{pause:.0f} s", style="yellow")

    report = run_checks(target, check_dirs, junitxml=junitxml, wait=wait, on_retry=on_retry)
    from mlxops.checks.report import print_report, to_json  # rich's table: when printed

    if as_json:
        console.print_json(to_json(report))
    else:
        print_report(report)
    sys.exit(report.exit_code)
