"""A command's start-up, up to its first connection: what it imports and how long it takes.

``python -m mlxops.cli.startup ARGS...`` runs ``mlxops ARGS...`` as the CLI would,
except that the first connection a command asks for (:meth:`Connector.connect`) ends the
process at once, exit :data:`CONNECTING`: everything before it (parsing, reading and
checking the inventory and job files, the imports) is what a person waits for before
mlxops says anything of the hosts. With ``python -X importtime`` in front it lists the
modules that start-up imported (:func:`imported_modules`); with :data:`MODULES_FILE` set
in the environment it writes every module loaded by then (``sys.modules``, which also
holds those ``importlib.import_module`` loaded, as the command table and the lazy
packages do: importtime does not list those) to that file, one name a line.

tests/unit/cli/test_startup.py holds that no command imports a heavy module it does not use
(:data:`HEAVY`); benchmarks/startup.py times each command against a bare Python that
imports click. Not a command: the measuring tool of the commands' start-up, in their room.
"""

from __future__ import annotations

import _thread
import importlib.util
import os
import re
import sys
import types
from collections.abc import Iterable
from pathlib import Path

#: The files the start-up test and benchmark start commands on: an inventory of two hosts
#: no one answers for (TEST-NET-1) and a job on them.
SAMPLE_FILES = {"inventory.yml": """\
all:
  hosts:
    mac1: {ansible_host: 192.0.2.1}
    mac2: {ansible_host: 192.0.2.2}
""", "job.yml": """\
name: startup
inventory: inventory.yml
hosts: all
trainer:
  model: {dims: 32, layers: 1, heads: 2, vocab_size: 256, seq_len: 32}
  train: {steps: 10, global_batch: 4}
"""}


def write_sample_files(directory: Path) -> None:
    """:data:`SAMPLE_FILES` into ``directory``."""
    for name, text in SAMPLE_FILES.items():
        (directory / name).write_text(text)


#: The exit code of a start-up stopped at its first connection.
CONNECTING = 97
#: Held by the first connection (``_thread``: built in, so the driver imports nothing).
_FIRST_CONNECTION = _thread.allocate_lock()
#: The environment variable naming the file the loaded modules are written to.
MODULES_FILE = "MLXOPS_STARTUP_MODULES"
#: The module whose ``Connector.connect`` every command's first connection goes through.
CONNECTOR = "mlxops.transport.connector"

#: Modules whose import costs tens of milliseconds or more, and who uses them: a command
#: imports one only when it does what the module is for.
HEAVY = {
    "fabric": "SSH connections (with invoke, paramiko)",
    "invoke": "Fabric's runner",
    "paramiko": "SSH connections",
    "rich": "terminal output (tables, progress, colour)",
    "jinja2": "templates and `when:` expressions (provision, hostfiles)",
    "yaml": "inventory, job and play files",
    "pytest": "mlxops check (its pytest session)",
    "_pytest": "mlxops check (its pytest session)",
    "testinfra": "mlxops check (the host fixture)",
    "mlx": "the trainer (on nodes), the bench's all-reduce",
    "numpy": "the trainer (on nodes)",
    "http.server": "mlxops dashboard",
    "asyncio": "nothing of mlxops (invoke's unittest.mock imports it)",
}

_LINE = re.compile(r"^import time:\s+\d+ \|\s+\d+ \| ( *)(\S+)\s*$")


def imported_modules(importtime_stderr: str) -> list[str]:
    """The modules ``python -X importtime`` reported on stderr, in the order they were
    imported (children before their parent, as it prints them)."""
    return [m.group(2) for line in importtime_stderr.splitlines()
            if (m := _LINE.match(line))]


def heavy_imported(modules: Iterable[str]) -> set[str]:
    """The :data:`HEAVY` modules (a package, or one of its submodules) among ``modules``."""
    found = set()
    for name in modules:
        for heavy in HEAVY:
            if name == heavy or name.startswith(heavy + "."):
                found.add(heavy)
    return found


def run_until_connecting(argv: list[str]) -> None:
    """``mlxops argv...``, ended (exit :data:`CONNECTING`) where it would first connect.

    :meth:`Connector.connect` is replaced as its module is imported, by the command itself
    (:class:`_EndAtConnect`): the driver imports nothing of mlxops that the command would
    not, so what it measures is the command's own start-up.
    """
    sys.meta_path.insert(0, _EndAtConnect())
    from mlxops.cli import main

    sys.argv = ["mlxops", *argv]
    try:
        main()
    finally:  # a command that ended before connecting (--help, bad input, no jobs)
        _write_modules()


def _connect(self: object, host: object) -> None:
    # Hosts connect from parallel workers: the first one ends the process, the others wait
    # here (else one could truncate the modules file as the first one exits).
    _FIRST_CONNECTION.acquire()
    sys.stdout.flush()
    sys.stderr.flush()
    _write_modules()
    os._exit(CONNECTING)  # no cleanup to run: nothing was connected


def _write_modules() -> None:
    path = os.environ.get(MODULES_FILE)
    if path:
        Path(path).write_text("".join(f"{name}\n" for name in sorted(sys.modules)))


class _EndAtConnect:
    """An import hook (a ``sys.meta_path`` finder) for :data:`CONNECTOR`: its module is
    found and run as usual, then its ``Connector.connect`` is :func:`_connect`."""

    def find_spec(self, fullname: str, path: object, target: object = None) -> object:
        if fullname != CONNECTOR:
            return None
        sys.meta_path.remove(self)  # once, and find the module the ordinary way
        spec = importlib.util.find_spec(fullname)
        run = spec.loader.exec_module

        def run_then_patch(module: types.ModuleType) -> None:
            run(module)
            module.Connector.connect = _connect

        spec.loader.exec_module = run_then_patch
        return spec


if __name__ == "__main__":
    run_until_connecting(sys.argv[1:])
