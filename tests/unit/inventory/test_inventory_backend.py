"""One answer to "which backend do these hosts run?" (mlxops.inventory.backend), asked by
bench, check and the selftest alike: the cases as data, then each command's own path on
the case where the two old rules disagreed (one host unset, one jaccl)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from mlxops.bench import run as bench_run
from mlxops.checks import target as check_target
from mlxops.checks.target import load_target
from mlxops.cli import cli
from mlxops.errors import EXIT_BAD_INPUT, UserError
from mlxops.inventory import load_inventory
from mlxops.inventory.backend import hosts_backend
from mlxops.selftest import run as selftest_run

# (each host's mlxops_backend, None: unset) -> the backend, or the error's text.
CASES = [
    ([None, None], "ring"),
    ([None], "ring"),
    (["mpi", "mpi"], "mpi"),
    (["jaccl", "jaccl", "jaccl"], "jaccl"),
    (["ring", None], "ring"),
    (["mpi", "ring"], "the selected hosts name different backends (mac1 mpi, mac2 ring)"),
    ([None, "jaccl"], "the selected hosts name different backends (mac1 ring (unset), "
                      "mac2 jaccl)"),
    (["mpi", None], "(mac1 mpi, mac2 ring (unset))"),
]


def write_inventory(tmp_path: Path, backends: list[str | None]) -> Path:
    hosts = {}
    for i, backend in enumerate(backends, start=1):
        # TEST-NET addresses: nothing answers there, and no test here connects.
        hosts[f"mac{i}"] = {"ansible_host": f"192.0.2.{i}",
                            **({"mlxops_backend": backend} if backend else {}),
                            **({"mlxops_rdma": {}} if backend == "jaccl" else {})}
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump({"all": {"vars": {"mlxops_root": "/srv/mlxops"},
                                            "hosts": hosts}}))
    return path


@pytest.mark.parametrize("backends, want", CASES, ids=[str(c[0]) for c in CASES])
def test_the_rule(tmp_path, backends, want) -> None:
    inv = load_inventory(write_inventory(tmp_path, backends))
    hosts = inv.select(None)
    if "different" in want or want.startswith("("):
        with pytest.raises(UserError) as got:
            hosts_backend(hosts, inv.path)
        message = str(got.value)
        assert message.startswith(f"{inv.path}: mlxops_backend: ") and "\n" not in message
        assert want in message
    else:
        assert hosts_backend(hosts, inv.path) == want


def test_bench_check_and_selftest_ask_the_same_function() -> None:
    assert bench_run.hosts_backend is check_target.hosts_backend is \
        selftest_run.hosts_backend is hosts_backend


def test_one_host_unset_and_one_jaccl_is_refused_by_check_bench_and_selftest(tmp_path):
    path = write_inventory(tmp_path, [None, "jaccl"])
    wanted = "mlxops_backend: the selected hosts name different backends (mac1 ring (unset)"
    with pytest.raises(UserError, match=r"mac1 ring \(unset\), mac2 jaccl"):
        load_target(path)
    for argv in (["bench", str(path)], ["selftest", str(path)]):
        result = CliRunner().invoke(cli, argv)
        assert result.exit_code == EXIT_BAD_INPUT, (argv, result.output)
        assert wanted in result.output
    # The same hosts agree once the unset one names jaccl too (or a --limit leaves one).
    agreed = load_inventory(write_inventory(tmp_path, ["jaccl", "jaccl"]))
    assert hosts_backend(agreed.select(None), agreed.path) == "jaccl"
    one = load_inventory(path)
    assert hosts_backend(one.select("mac2"), one.path) == "jaccl"
