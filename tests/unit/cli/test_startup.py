"""Start-up: a command imports the heavy modules it uses, and no others.

Each case runs the real CLI under ``python -X importtime``, up to its first connection
(:mod:`mlxops.cli.startup`: the connection itself ends the process), and compares the
heavy modules it imported (:data:`~mlxops.cli.startup.HEAVY`: Fabric, paramiko,
rich, Jinja2, PyYAML, pytest, mlx, ...) with the ones the command has a use for by then.
No timing here: the seconds are benchmarks/startup.py's.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mlxops.cli import COMMANDS
from mlxops.cli.startup import (
    CONNECTING,
    MODULES_FILE,
    heavy_imported,
    imported_modules,
    write_sample_files,
)

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("startup")
    write_sample_files(d)
    (d / "home").mkdir()
    return d


def start_imports(files: Path, *args: str) -> tuple[int, set[str], str]:
    """``mlxops args...`` up to its first connection: exit code, every module imported
    (those importtime lists, and every one in ``sys.modules`` at the end), stderr."""
    loaded = files / f"modules-{os.getpid()}-{'-'.join(args)}.txt".replace("/", "_")
    env = {**os.environ, "MLXOPS_HOME": str(files / "home"), "COLUMNS": "100",
           MODULES_FILE: str(loaded)}
    env.pop("MLXOPS_DEBUG", None)
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "mlxops.cli.startup",
                           *args], capture_output=True, text=True, timeout=120, env=env,
                          cwd=files, stdin=subprocess.DEVNULL)
    modules = imported_modules(proc.stderr)
    assert "mlxops.cli" in modules, proc.stderr[-2000:]  # the parse found the imports
    in_sys_modules = loaded.read_text().split()
    assert "mlxops.cli" in in_sys_modules, in_sys_modules  # the file was written
    errors = "\n".join(line for line in proc.stderr.splitlines()
                       if not line.startswith("import time:"))
    return proc.returncode, set(modules) | set(in_sys_modules), errors


def start(files: Path, *args: str) -> tuple[int, set[str], str]:
    """``mlxops args...`` up to its first connection: exit code, heavy modules, stderr."""
    code, modules, errors = start_imports(files, *args)
    return code, heavy_imported(modules), errors


def test_the_parser_sees_a_heavy_import():
    # A check that could not fail would pass on a parser that finds nothing.
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c",
                           "import mlxops.transport.jumps"], capture_output=True, text=True,
                          timeout=120)
    assert {"fabric", "paramiko", "invoke"} <= heavy_imported(imported_modules(proc.stderr))
    assert heavy_imported(["yaml.nodes", "richer", "http", "mlxops.render"]) == {"yaml"}


def test_help_lists_every_command_and_imports_nothing_heavy(files):
    code, heavy, errors = start(files, "--help")
    assert code == 0, errors
    assert heavy == set()


def test_help_imports_no_command_module(files):
    # The listing comes from the table's summaries (tests/unit/cli/test_cli_summaries.py).
    code, modules, errors = start_imports(files, "--help")
    assert code == 0, errors
    assert "Commands:" not in errors
    commands = {m for m in modules if m.startswith("mlxops.cli.")} - {"mlxops.cli.startup"}
    assert commands == set()
    # The driver's own hook imports nothing the command would not (Connector never was).
    assert "mlxops.transport.connector" not in modules


# Parts of mlxops a command has no use for before its first connection (they come later,
# with what uses them): (args, modules that must not be imported, one that must be).
NOT_YET = [
    # No jobs: answered from the job directories, the record's schema never imported.
    (["status"], {"mlxops.jobs.record", "mlxops.jobs.spec"}, "mlxops.jobs.jobdirs"),
    # A bad job file is refused before the launch machinery is imported.
    (["launch", "missing.yml"], {"mlxops.jobs.launch", "mlxops.jobs.preflight"}, "mlxops.cli.jobs"),
    # Only the hosts are selected and checked before launch's pre-flight connects: no
    # task module but the bundle's, no notifier (urllib), no node answers yet.
    (["launch", "job.yml"], {"mlxops.tasks.mlx_lm", "mlxops.tasks.macos",
                             "mlxops.notify.deliver", "urllib.request",
                             "mlxops.node.protocol.answers"}, "mlxops.jobs.preflight"),
    # plan selects the hosts (jobs.selection) and never runs a pre-flight.
    (["plan", "job.yml"], {"mlxops.jobs.preflight", "mlxops.jobs.launch"},
     "mlxops.jobs.selection"),
    # check: the all_sum's job machinery comes after every host was read, and no pytest
    # plugin of the environment is loaded but testinfra's (xdist: execnet; anyio: asyncio).
    # (pytest itself is imported while the hosts are read: the test below.)
    (["check", "inventory.yml"], {"mlxops.bench.allreduce", "mlxops.jobs.launch",
                                  "xdist", "execnet", "anyio"}, "mlxops.checks.cluster"),
]


@pytest.mark.parametrize("args, unused, used", NOT_YET, ids=lambda x: " ".join(x)
                         if isinstance(x, list) else None)
def test_a_start_imports_nothing_it_has_no_use_for_yet(files, args, unused, used):
    code, modules, errors = start_imports(files, *args)
    assert code in (0, 2, CONNECTING), errors
    imported = modules
    assert used in imported  # the parse saw the command get that far
    assert not unused & imported, sorted(unused & imported)


def test_check_starts_reading_the_hosts_before_it_imports_pytest(files):
    """The reads' thread starts before pytest's ~0.2 s import (checks/run.py): at that
    moment no pytest module is loaded. (Which ones are by the first connection depends on
    how far the main thread got meanwhile.)"""
    program = ("import os, sys\n"
               "import mlxops.checks.cluster as cluster\n"
               "def started(self, c):\n"
               "    print(sorted(m for m in sys.modules if 'pytest' in m), flush=True)\n"
               "    os._exit(0)\n"
               "cluster.Reading.__init__ = started\n"
               "from mlxops.cli import main\n"
               "sys.argv = ['mlxops', 'check', 'inventory.yml']\n"
               "main()\n")
    proc = subprocess.run([sys.executable, "-c", program], cwd=files, capture_output=True,
                          text=True, timeout=120,
                          env={**os.environ, "MLXOPS_HOME": str(files / "home")})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", proc.stdout


@pytest.mark.parametrize("command", ["status", "check"])
def test_a_commands_help_imports_nothing_heavy(files, command):
    code, heavy, errors = start(files, command, "--help")
    assert code == 0, errors
    assert heavy == set()


def test_every_registered_command_loads(files):
    from mlxops.cli import cli

    assert sorted(cli.commands) == sorted(COMMANDS)
    assert all(cli.commands[name].name == name for name in COMMANDS)


@pytest.mark.parametrize("args, uses", [
    # No jobs yet: nothing to read but the job directory, one plain line.
    (["status"], set()),
    (["status", "--json"], set()),
    # Bad input: the error before anything else is read (no YAML parsed: no such file).
    (["launch", "missing.yml"], set()),
    (["run", "missing.yml", "--", "true"], set()),
    # The play is read and checked (YAML, its `when:` in Jinja2) before the inventory.
    (["provision", "missing.yml"], {"yaml", "jinja2"}),
])
def test_a_start_that_ends_before_connecting(files, args, uses):
    code, heavy, errors = start(files, *args)
    assert code in (0, 2), errors
    assert heavy == uses, errors


@pytest.mark.parametrize("args, uses", [
    (["run", "inventory.yml", "--", "true"], {"yaml", "rich"}),
    (["provision", "inventory.yml"], {"yaml", "jinja2", "rich"}),
    (["trust", "inventory.yml"], {"yaml", "rich"}),
    (["bench", "inventory.yml"], {"yaml", "rich"}),
    (["launch", "job.yml"], {"yaml", "rich"}),
    (["plan", "job.yml"], {"yaml"}),
    (["check", "inventory.yml"], {"yaml", "rich", "pytest", "_pytest", "testinfra"}),
])
def test_a_start_up_to_the_first_connection(files, args, uses):
    code, heavy, errors = start(files, *args)
    assert code == CONNECTING, errors
    assert heavy <= uses, (heavy - uses, errors)
    assert not heavy & {"fabric", "paramiko", "invoke", "mlx", "numpy", "asyncio"}


# Packages whose names are imported from their modules when first asked for (PEP 562):
# the package, and what importing it alone must not import.
LAZY_PACKAGES = {
    "mlxops.transport": ["mlxops.transport.executor", "mlxops.transport.connection"],
    "mlxops.node.protocol": ["mlxops.node.protocol.answers", "mlxops.node.protocol.commands"],
}


@pytest.mark.parametrize("package", sorted(LAZY_PACKAGES))
def test_a_lazy_package_gives_every_name_it_exports_from_its_home(package):
    import importlib

    module = importlib.import_module(package)
    for name in module.__all__:
        value = getattr(module, name)
        home = module._HOMES.get(name)
        if home is not None:
            assert value is getattr(importlib.import_module(f"{package}.{home}"), name)
    assert set(module._HOMES) <= set(module.__all__)
    with pytest.raises(AttributeError):
        module.no_such_name  # noqa: B018 - the lookup is the test


@pytest.mark.parametrize("package", sorted(LAZY_PACKAGES))
def test_importing_a_lazy_package_imports_none_of_its_lazy_modules(package):
    code = (f"import sys, {package}; "
            f"print(sorted(m for m in {LAZY_PACKAGES[package]!r} if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)
    assert proc.stdout.strip() == "[]"


def test_the_task_registry_imports_every_module_that_defines_a_task():
    import mlxops.tasks

    package = Path(mlxops.tasks.__file__).parent
    defining = {p.stem for p in package.glob("*.py") if "\n@task(" in p.read_text()}
    assert defining == set(mlxops.tasks.TASK_MODULES)
    assert {"sync", "facts", "mlx_lm"} <= {spec.name for spec in mlxops.tasks.REGISTRY.values()}


def test_importing_one_task_module_imports_no_other():
    code = ("import sys, mlxops.tasks.facts; "
            "print(sorted(m for m in sys.modules if m.startswith('mlxops.tasks.')))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)
    assert proc.stdout.strip() == "['mlxops.tasks.base', 'mlxops.tasks.facts']"
