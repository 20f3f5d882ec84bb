"""tests/conftest.py: which test modules `make test` keeps on one pytest-xdist worker."""

from __future__ import annotations

import importlib.util
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def _suite_conftest():
    # Loaded from its path: under a whole-suite run `conftest` may name another one.
    spec = importlib.util.spec_from_file_location("suite_conftest", TESTS / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_grouped_module_exists_and_each_group_has_the_pgrep_it_is_for():
    suite = _suite_conftest()
    for group, modules in suite.SHARED_WORKER.items():
        paths = [TESTS / "integration" / module for module in modules]
        assert all(path.is_file() for path in paths), (group, modules)
        assert any("pgrep" in path.read_text() for path in paths), group


def test_a_group_is_one_unit_and_every_other_module_its_own():
    scope_of = _suite_conftest().scope_of
    assert scope_of("tests/integration/test_bench.py::test_x[bash]") == "bench"
    assert scope_of("tests/integration/test_selftest.py::test_y") == "bench"
    assert scope_of("tests/integration/test_mac_nodes.py::test_z") == "mpi"
    assert scope_of("tests/integration/test_jobs.py::test_x[zsh]") == \
        "tests/integration/test_jobs.py"
    # a unit module of the same name is not in the integration group
    assert scope_of("tests/unit/test_bench.py::test_x") == "tests/unit/test_bench.py"


def test_the_longest_units_start_first_and_the_unit_tests_last():
    suite = _suite_conftest()
    for unit in suite.LONGEST_FIRST:  # each names a group or a module that exists
        assert unit in suite.SHARED_WORKER or (TESTS.parent / unit).is_file(), unit
    collected = ["tests/unit/jobs/test_job_record.py::test_a",
                 "tests/integration/test_sandbox.py::test_b",
                 "tests/dataprep/test_memory_bound.py::test_c",
                 "tests/integration/test_selftest.py::test_d",
                 "tests/integration/test_bench.py::test_e[zsh]"]
    order = sorted(collected, key=suite.start_order)
    assert order == ["tests/integration/test_selftest.py::test_d",   # the bench group
                     "tests/integration/test_bench.py::test_e[zsh]",
                     "tests/dataprep/test_memory_bound.py::test_c",
                     "tests/integration/test_sandbox.py::test_b",
                     "tests/unit/jobs/test_job_record.py::test_a"]
