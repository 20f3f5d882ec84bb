"""The house's rooms, read from the imports: no arrow from a lower room to a higher one, every
import cycle type-only, no module over 400 lines without its reason at its top.

A room is a package under ``mlxops/`` or a module beside them. :data:`ROOMS` is their order,
lowest first: a room imports only from its own floor and the floors below it (rooms share
a floor when neither needs the other above it). The order, as the code is:

- the synced rooms first: ``node`` (the node's helpers) and ``trainer`` (it reads the node
  protocol) run on every node with the standard library, mlx and numpy only, so they can
  import nothing of the controller; ``finetune`` (mlx-lm too) builds on the trainer;
- then the controller's helpers that know of no host (quoting, errors, files, YAML, tar);
- then getting commands to hosts (``transport``, with the node-command runner), the
  inventory, the provisioning tasks and plays, the jobs, the bench, the planning that reads
  jobs and bench, the checks, the monitor (it reads jobs and is fed by the watchdog's status
  hook), the selftest that runs all of them, the sandbox, and the commands.

An import inside ``if TYPE_CHECKING:`` is no arrow (it never runs); an import inside a
function is one (a lazy import that hides a cycle is still a cycle). Relative imports are
arrows like absolute ones (``from .x import y`` in ``mlxops.trainer.train`` is
``mlxops.trainer.x``), and a name a PEP 562 package imports on first use
(``mlxops/node/lazy.py``) is an arrow to the module that defines it.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import mlxops

PACKAGE = Path(mlxops.__file__).parent
MAX_LINES = 400
#: The first line of the reason a longer module gives in its docstring.
LONG_REASON = "Longer than 400 lines because"

ROOMS: list[tuple[str, ...]] = [
    ("node",),
    ("trainer",),
    ("finetune",),  # fine-tuning, synced beside the trainer: it builds on it (and mlx-lm)
    # macnet, datalink and rdmaready are pure rules over a Mac's recorded facts, beside
    # hostfacts and readiness (tasks gathers the facts, checks and bench ask the rules)
    ("mlxops", "errors", "shell", "paths", "yamlfile", "filelock", "archive", "ignore",
     "devtools", "hostfacts", "readiness", "events", "notify", "dataprep",
     # pure rules over the facts record: a Mac's network facts, the data-link and RDMA rules
     "macnet", "datalink", "rdmaready",
     # where a job's supervisor lives on its host (stdlib only: the provision task's too)
     "supervisorsite"),
    ("transport",),
    ("console", "trust", "inventory", "sync"),
    ("render",),  # renders an inventory's hosts (and their ring order) into hostfiles
    ("tasks",),
    ("playbook",),
    ("jobs",),
    ("bench",),
    ("planning",),
    ("checks",),
    ("monitor",),
    ("selftest",),
    ("init",),  # mlxops init: trust, inventory, the facts task and the trainer's plan
    ("sandbox",),
    ("adhoc",),
    ("cli",),
    ("__main__",),
]

#: Known, with the issue that removes them; each entry must still be true (the tests below
#: fail once it is not, so the lists only shrink): an expected failure, strict.
KNOWN_LONG: dict[str, str] = {}
KNOWN_CYCLES: dict[frozenset[str], str] = {}


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = ("mlxops", *path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _type_only_nodes(tree: ast.AST) -> set[int]:
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(inner) for stmt in node.body for inner in ast.walk(stmt))
    return skipped


def _known_module(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _base(module: str, level: int) -> str:
    """The package a relative import of ``level`` dots starts from, inside ``module``.

    One dot is the package holding the module (the package itself for an ``__init__``);
    each further dot is one package up, as Python resolves it.
    """
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    for _ in range(level - 1):
        package = package.rpartition(".")[0]
    return package


def imported_names(module: str, node: ast.AST) -> list[str]:
    """The absolute dotted names an import statement in ``module`` asks for ([] if none).

    ``from mlxops.x import y`` and ``from .x import y`` both give ``mlxops.x.y`` (y is a
    module of its own, or a name in mlxops.x); ``from . import y`` gives ``<package>.y``.
    """
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level == 0:
        prefix = node.module or ""
    else:
        base = _base(module, node.level)
        prefix = f"{base}.{node.module}" if node.module else base
    return [f"{prefix}.{alias.name}" for alias in node.names]


def _lazy_homes(package: str) -> dict[str, str]:
    """The names a PEP 562 package imports on first use (``mlxops/node/lazy.py``): its
    ``_HOMES`` table, name -> the module under the package that defines it."""
    path = MODULES.get(package)
    if path is None or path.name != "__init__.py" or "lazy_names(" not in path.read_text():
        return {}
    return importlib.import_module(package)._HOMES


def _target(name: str) -> str | None:
    """The module importing ``name`` runs: a lazy package's name counts as its home module
    (``from mlxops.transport import Connector`` runs mlxops.transport.connector when used)."""
    package, _, attr = name.rpartition(".")
    home = _lazy_homes(package).get(attr)
    return f"{package}.{home}" if home else _known_module(name)


def imports(module: str) -> set[str]:
    """The mlxops modules ``module`` imports when it runs (type-only imports left out)."""
    tree = ast.parse(MODULES[module].read_text())
    skipped = _type_only_nodes(tree)
    targets: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        names = imported_names(module, node)
        for name in names:
            if name.split(".")[0] == "mlxops":
                target = _target(name)
                if target and target != module:
                    targets.add(target)
    return targets


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def floor(module: str) -> int:
    return next(i for i, rooms in enumerate(ROOMS) if room(module) in rooms)


def test_every_room_has_its_place_in_the_order():
    declared = [r for rooms in ROOMS for r in rooms]
    assert len(declared) == len(set(declared))
    assert {room(m) for m in MODULES} == set(declared)


def test_no_room_imports_from_a_room_above_it():
    upward = sorted(f"{module} imports {target}"
                    for module in MODULES for target in imports(module)
                    if floor(target) > floor(module))
    assert upward == []


def test_the_synced_rooms_import_nothing_of_the_controller():
    synced = [m for m in MODULES if room(m) in ("node", "trainer")]
    assert synced
    outside = sorted(f"{m} imports {t}" for m in synced for t in imports(m)
                     if room(t) not in ("node", "trainer") and t != "mlxops")
    assert outside == []


def cycles() -> list[frozenset[str]]:
    """The import graph's strongly connected components of more than one module (Tarjan)."""
    graph = {m: imports(m) for m in MODULES}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for module in MODULES:
        if module not in index:
            visit(module)
    return found


def test_every_import_cycle_is_type_only():
    assert [c for c in cycles() if c not in KNOWN_CYCLES] == []


def test_the_known_cycles_are_still_there():
    assert set(KNOWN_CYCLES) <= set(cycles()), "a known cycle is gone: drop it from the list"


def _long_modules() -> dict[str, int]:
    lengths = {str(p.relative_to(PACKAGE)): len(p.read_text().splitlines())
               for p in MODULES.values()}
    return {name: n for name, n in lengths.items() if n > MAX_LINES}


def test_no_module_is_over_400_lines_without_its_reason_at_its_top():
    unexplained = []
    for name in _long_modules():
        doc = ast.get_docstring(ast.parse((PACKAGE / name).read_text())) or ""
        if LONG_REASON not in doc and name not in KNOWN_LONG:
            unexplained.append(name)
    assert unexplained == []


def test_the_known_long_modules_are_still_long():
    assert set(KNOWN_LONG) <= set(_long_modules()), "a known long module got short: drop it"


# --- the rule itself, on imports written here --------------------------------------------


def test_an_import_inside_type_checking_is_no_arrow_but_one_in_a_function_is(tmp_path):
    source = ("from typing import TYPE_CHECKING\n"
              "if TYPE_CHECKING:\n    from mlxops.cli import main\n"
              "def f():\n    from mlxops.jobs import record\n")
    tree = ast.parse(source)
    skipped = _type_only_nodes(tree)
    kept = [ast.unparse(n) for n in ast.walk(tree)
            if isinstance(n, ast.ImportFrom) and id(n) not in skipped]
    assert kept == ["from typing import TYPE_CHECKING", "from mlxops.jobs import record"]


def test_a_name_imported_from_a_package_counts_as_the_package_a_module_as_itself():
    assert _known_module("mlxops.transport.Connector") == "mlxops.transport"
    assert _known_module("mlxops.transport.nodecmd") == "mlxops.transport.nodecmd"
    assert floor("mlxops.cli.run") > floor("mlxops.jobs.launch") > floor("mlxops.node.spawn")


def test_a_relative_import_is_an_arrow_to_the_module_it_names():
    # trainer/loop.py: `from . import checkpoint`, `from .resume import agreed_checkpoint`
    assert {"mlxops.trainer.checkpoint", "mlxops.trainer.resume"} <= imports(
        "mlxops.trainer.loop")
    tree = ast.parse("from . import balance\nfrom .config import load_config\n"
                     "from ..node import protocol\n")
    names = [n for stmt in tree.body for n in imported_names("mlxops.trainer.train", stmt)]
    assert names == ["mlxops.trainer.balance", "mlxops.trainer.config.load_config",
                     "mlxops.node.protocol"]
    # in a package's __init__, one dot is the package itself
    init = [n for stmt in ast.parse("from .config import X\n").body
            for n in imported_names("mlxops.trainer", stmt)]
    assert init == ["mlxops.trainer.config.X"]


def test_a_lazy_packages_name_is_an_arrow_to_its_home_module():
    assert _target("mlxops.transport.Connector") == "mlxops.transport.connector"
    assert _target("mlxops.node.protocol.parse_answer") == "mlxops.node.protocol.answers"
    assert _target("mlxops.node.protocol.METRICS") == "mlxops.node.protocol"
