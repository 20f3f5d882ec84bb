"""Which tests share a pytest-xdist worker (``make test`` runs every pytest on workers).

``--dist loadfile`` sends each test module to one worker, so its module fixtures are
made once and its tests run in order. Here it also keeps a few modules on one worker, one
after another (:data:`SHARED_WORKER`): each group holds a module that asserts no process
of a kind is left on the machine (the sandbox nodes of every worker share its PID
namespace) and the modules that start such processes. ``xdist_group`` marks would say
the same, but pytest-xdist 3.8 writes the group into ``item._nodeid``, which pytest 9 no
longer reads: the marks are silently ignored, so the grouping is done here, by file.
"""

from __future__ import annotations

import signal

import pytest


def pytest_configure(config):
    # Tests press Ctrl-C on what they start (SIGINT to a CLI, a dashboard, a selftest). A
    # suite started in the background by a shell without job control (`make test &`, a CI
    # runner's nohup) ignores SIGINT, and an ignored signal stays ignored through fork and
    # exec: every process the tests start, the sandbox's sshds and all they run would
    # ignore that Ctrl-C. Python's own handler here gives them the default again.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)

SHARED_WORKER = {  # modules of tests/integration
    # test_bench pgreps for any bench server or all-reduce rank; check's all_sum and the
    # selftest run the all-reduce, bench_local the servers and the ranks
    "bench": ("test_bench.py", "test_bench_local.py", "test_check.py", "test_selftest.py"),
    # test_jobs_mpi pgreps for any orted or mpirun; these run mpi jobs too
    "mpi": ("test_jobs_mpi.py", "test_blas_ranks.py", "test_mac_nodes.py"),
}
_GROUP_OF = {f"tests/integration/{module}": group
             for group, modules in SHARED_WORKER.items() for module in modules}

# The units of work that take longest, longest first (a fresh clone's `make test` on this
# project's 2-core machine, run D of docs/testing.md "The suite's time": the sums of their
# tests' --durations). Workers take units in this order, then the other modules in
# collection order, the unit tests last: many small units that fill the end. xdist's own
# order (most tests first) started the 2-test memory-bound module (150 s) last, and one
# worker ran it alone for the suite's last two minutes. A module missing here is only
# started later; a unit that grew long belongs here.
LONGEST_FIRST = (
    "bench",                                    # selftest, bench, check: ~550 s
    "tests/integration/test_supervisor.py",
    "tests/integration/test_jobs.py",
    "tests/integration/test_pipeline_job.py",
    "mpi",
    "tests/dataprep/test_memory_bound.py",
    "tests/integration/test_init.py",
    "tests/integration/test_serve.py",
    "tests/finetune/test_pipeline_finetune.py",
    "tests/finetune/test_plan_measured.py",
    "tests/integration/test_monitor.py",
    "tests/integration/test_zero_nodes.py",
    "tests/finetune/test_resume.py",
    "tests/integration/test_provision.py",
    "tests/integration/test_collectives.py",
)


def scope_of(nodeid: str) -> str:
    """The unit a worker runs whole: the test's file (its path from the repository's
    root, as in the node id), or the group its file is in."""
    path = nodeid.split("::", 1)[0]
    return _GROUP_OF.get(path, path)


def start_order(nodeid: str) -> tuple[int, int]:
    """Where a test's unit comes in the workers' queue: the units of
    :data:`LONGEST_FIRST` in that order, then the other modules, the unit tests last
    (ties keep the collection's order)."""
    scope = scope_of(nodeid)
    if scope in LONGEST_FIRST:
        return 0, LONGEST_FIRST.index(scope)
    return (2 if nodeid.startswith("tests/unit/") else 1), 0


@pytest.hookimpl(trylast=True)  # after tests/integration's own order (zsh cases last)
def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: start_order(item.nodeid))


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadfile":
        return None
    # imported here: a run without workers never loads xdist's scheduling code
    from xdist.scheduler import LoadFileScheduling

    # The queue in the collection's order (start_order), not xdist's most-tests-first.
    config.option.loadscopereorder = False

    class FileOrGroupScheduling(LoadFileScheduling):
        """xdist's ``loadfile`` with the files of :data:`SHARED_WORKER` grouped."""

        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    return FileOrGroupScheduling(config, log)
