"""Each record that crosses a process or a host has one definition: its field names (and
the names of the node root's files, and the rank environment's variables) appear as string
literals in that definition only. A small scan of the package's syntax trees, docstrings
left out (they explain, they do not read)."""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import fields
from pathlib import Path

from mlxops.jobs.status import LauncherStatus
from mlxops.node.protocol.calibration import Calibration, CalibrationAnswer
from mlxops.node.protocol.metrics import FIELDS as METRICS_FIELDS

PACKAGE = Path(__file__).resolve().parents[3] / "mlxops"
PROTOCOL = PACKAGE / "node" / "protocol"


@functools.cache
def literals(path: Path) -> tuple[tuple[int, str], ...]:
    """Every string constant of a module but its docstrings (f-strings' parts included);
    parsed once for all the tests here."""
    tree = ast.parse(path.read_text())
    docs = {id(n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    return tuple((node.lineno, node.value) for node in ast.walk(tree)
                 if isinstance(node, ast.Constant) and isinstance(node.value, str)
                 and id(node) not in docs)


def modules(*, but: tuple[Path, ...] = ()) -> list[Path]:
    return [p for p in sorted(PACKAGE.rglob("*.py")) if p not in but]


def where(found: list[tuple[Path, int, str]]) -> list[str]:
    return [f"{p.relative_to(PACKAGE.parent)}:{line}: {text!r:.80}" for p, line, text in found]


#: The node root's names as a path spells them (``f"{root}/env.sh"``, ``"runs/" + name``),
#: and the rank environment's variables.
SPELLED = re.compile(
    r"(^|[/\s])(env\.sh|venv/bin/python)($|[/\s])"
    r"|(^/?|\s)(hostfiles|runs|code|cache|venv)/|^/(hostfiles|runs|code|cache|venv)$"
    r"|\bMLXOPS_(WORLD_SIZE|LOCAL_RANK|BACKEND|RUN_DIR|RESUME|HOST)\b"
    r"|\bMLX_(RANK|HOSTFILE|IBV_DEVICES|JACCL_COORDINATOR|JACCL_RING|MPI_LIBNAME)\b")
#: Not the node root: the trainer's default ``out``, relative to wherever it is run.
NOT_THE_NODE_ROOT = {("trainer/config.py", "runs/default"),
                     ("finetune/config.py", "runs/finetune")}


def test_the_node_root_and_the_rank_environment_are_spelt_in_the_protocol_only():
    found = [(p, line, text) for p in modules(but=(PROTOCOL / "layout.py",
                                                   PROTOCOL / "rankenv.py"))
             for line, text in literals(p) if SPELLED.search(text)
             and (str(p.relative_to(PACKAGE)), text) not in NOT_THE_NODE_ROOT]
    assert where(found) == []


#: Names the metrics line shares with other records, each spelt where that record is
#: (until each is a type of its own): the checkpoint's ``state.json`` (step, world_size,
#: micro_batch, accumulation, consistency_repairs, batch_split), ``calibration.json``
#: (batch_split), the report document's summary and series (docs/formats.md), the
#: trainer's config (micro_batch, lr), the monitor's series and alerts (val_loss).
SHARED_WITH_OTHER_RECORDS = {"step", "time", "loss", "tokens_per_sec", "compute_time",
                             "comm_time", "peak_memory", "world_size", "micro_batch",
                             "accumulation", "consistency_repairs", "batch_split", "lr",
                             "val_loss"}   # the heartbeat (Progress) carries the last one


def test_the_metrics_line_fields_are_spelt_in_its_definition_only():
    own = set(METRICS_FIELDS) - SHARED_WITH_OTHER_RECORDS
    assert own == {"step_time", "active_memory", "planned_memory", "val_perplexity",
                   "trainable_params"}
    found = [(p, line, text) for p in modules(but=(PROTOCOL / "metrics.py",))
             for line, text in literals(p) if text in own]
    assert where(found) == []


def test_the_launchers_status_is_read_by_attribute():
    """``status.launcher["exit"]`` was a dict read; a LauncherStatus has attributes."""
    names = {f.name for f in fields(LauncherStatus)}
    found = []
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            target, key = None, None
            if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
                target, key = node.value, node.slice.value
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr == "get" and node.args
                  and isinstance(node.args[0], ast.Constant)):
                target, key = node.func.value, node.args[0].value
            said = ast.unparse(target) if target is not None else ""
            if key in names and re.search(r"(^|\.)launcher$", said):
                found.append((path, node.lineno, f"{said}[{key!r}]"))
    assert where(found) == []


def _spelt_outside(names: set[str], definition: Path,
                   allowed: set[tuple[str, str]] = frozenset()) -> list[str]:
    found = [(p, line, text) for p in modules(but=(definition,))
             for line, text in literals(p) if text in names
             and (str(p.relative_to(PACKAGE)), text) not in allowed]
    return where(found)


def test_the_calibration_fields_are_spelt_in_its_definition_only():
    """``calibration.json`` is read on the node and carried typed (``mlxops plan`` used
    to ``cat`` it and read it with ``.get``). Its other fields are words every record
    uses (step, time, hosts, world_size) or the metrics line's (batch_split)."""
    names = {f.name for c in (Calibration, CalibrationAnswer) for f in fields(c)}
    own = names - {"step", "time", "hosts", "world_size", "batch_split", "calibration"}
    assert own == {"samples_per_sec", "unreadable"}
    assert _spelt_outside(own, PROTOCOL / "calibration.py") == []
