"""The memory plan's budget on a Mac: MLX's recommended working set, as the node reports it.

``data/memory/device_info.yml`` holds what ``device_info()`` answered on real machines
(each with its source). A stand-in ``mlx.core`` returns those answers, so the node's reader
(the ``ready`` answer of ``mlxops check``), the facts probe (``mlxops plan``) and the plan
all read the recorded dicts, not numbers typed into the test.
"""

from __future__ import annotations

import json
import subprocess
import sys
import types
from dataclasses import replace
from pathlib import Path

import pytest

from mlxops.hostfacts import HostFacts, Interpreter
from mlxops.node import memory, protocol
from mlxops.node.ready import ready
from mlxops.readiness import controller_mlx_lm_version
from mlxops.tasks import facts as F
from mlxops.trainer.plan import CPU_FRACTION, plan_memory
from mlxops.yamlfile import read_yaml

DATA = Path(__file__).parents[1] / "data" / "memory" / "device_info.yml"
RECORDED = read_yaml(DATA)
IDS = [r["answer"]["architecture"] for r in RECORDED]
GB = 1024**3
JOB = {"model": {"dims": 256, "layers": 4, "heads": 4, "seq_len": 128},
       "train": {"global_batch": 8, "micro_batch": 4}}

STAND_IN = """
__version__ = "0.32.4"
ANSWER = {answer!r}


def device_info(d=None):
    return dict(ANSWER)
"""
#: mlx before 0.29 had the same dict under mx.metal only (how PR #1060 printed it).
OLD_STAND_IN = """
__version__ = "0.28.0"
ANSWER = {answer!r}


class metal:
    @staticmethod
    def is_available():
        return "max_recommended_working_set_size" in ANSWER

    @staticmethod
    def device_info():
        return dict(ANSWER)
"""


def stand_in(tmp: Path, answer: dict, template: str = STAND_IN) -> Path:
    """A directory holding an ``mlx`` package whose ``core`` answers ``answer``."""
    package = tmp / "mlx"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    (package / "core.py").write_text(template.format(answer=answer))
    return tmp


def use_stand_in(monkeypatch: pytest.MonkeyPatch, answer: dict, template: str) -> None:
    core = types.ModuleType("mlx.core")
    exec(template.format(answer=answer), core.__dict__)  # noqa: S102 - the test's own text
    package = types.ModuleType("mlx")
    package.core = core  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "mlx", package)
    monkeypatch.setitem(sys.modules, "mlx.core", core)


@pytest.mark.parametrize("recorded", RECORDED, ids=IDS)
def test_the_working_set_is_read_from_mlx_answer(recorded):
    assert memory.working_set_of(recorded["answer"]) == recorded["working_set"]


@pytest.mark.parametrize("template", [STAND_IN, OLD_STAND_IN], ids=["device_info", "metal"])
@pytest.mark.parametrize("recorded", RECORDED, ids=IDS)
def test_the_ready_answer_carries_it_over_the_wire(tmp_path, monkeypatch, recorded, template):
    use_stand_in(monkeypatch, recorded["answer"], template)
    assert memory.recommended_working_set() == recorded["working_set"]
    answer = ready(tmp_path, ip="", ports=[], mpi=False)
    line = protocol.answer_line(answer)
    assert protocol.parse_answer(protocol.READY, line).working_set == recorded["working_set"]


def test_no_mlx_no_working_set(monkeypatch):
    monkeypatch.setitem(sys.modules, "mlx", None)  # import mlx.core raises ImportError
    assert memory.recommended_working_set() is None


@pytest.mark.parametrize("recorded", RECORDED, ids=IDS)
def test_the_facts_probe_reports_it_and_the_plan_budgets_with_it(tmp_path, recorded):
    path = stand_in(tmp_path, recorded["answer"])
    out = subprocess.run([sys.executable, "-c", F.PROBE], capture_output=True, text=True,
                         env={"PYTHONPATH": str(path)}, check=True).stdout
    probe = F.parse_probe(f"/py\n{out}")
    # mlx-lm's version is its package metadata: this interpreter's own installed one.
    assert probe == Interpreter(path="/py", version=probe.version, mlx="0.32.4",
                                working_set=recorded["working_set"],
                                mlx_lm=controller_mlx_lm_version())
    facts = replace(HostFacts.unknown(), python=probe, venv=None, memory_bytes=192 * GB)
    assert facts.ranks_working_set == recorded["working_set"]
    plan = plan_memory(JOB, facts.memory_bytes, 2, ranks_per_node=2,
                       working_set=facts.ranks_working_set)
    if recorded["working_set"]:
        assert (plan.budget_bytes, plan.budget_from) == (recorded["working_set"] // 2,
                                                         "working set")
    else:
        assert (plan.budget_bytes, plan.budget_from) == (
            int(192 * GB * CPU_FRACTION) // 2, "memory")


def test_the_venv_answers_for_the_ranks_and_older_facts_have_no_working_set():
    python = Interpreter("/usr/bin/python3", "3.9.6", None, None)
    venv = Interpreter("/v/bin/python", "3.11.7", "0.32.4", RECORDED[0]["working_set"])
    facts = replace(HostFacts.unknown(), python=python, venv=venv)
    assert facts.ranks_working_set == RECORDED[0]["working_set"]
    # Facts cached by an older probe: no working_set in the JSON, read back as None.
    doc = replace(HostFacts.unknown(), python=Interpreter("/p", "3.11.7", "0.32.4")).to_json()
    del doc["python"]["working_set"]
    assert HostFacts.from_json(json.loads(json.dumps(doc))).ranks_working_set is None
