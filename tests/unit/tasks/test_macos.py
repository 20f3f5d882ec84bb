"""The macos task as data: Darwin facts + vars + args in, commands out.

Each ``data/macos/*.yml`` names a facts output (``data/facts/<name>.txt``, illustrative:
see data/facts/README.md; parsed by the real parsers) and says which commands the steps must
hold. The task itself runs against Mac-like nodes in tests/integration/test_mac_nodes.py.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from mlxops.hostfacts import HostFacts
from mlxops.inventory import Host
from mlxops.tasks import macos
from mlxops.tasks.facts import build_facts, split_sections

DATA = Path(__file__).parents[1] / "data"
CASES = sorted((DATA / "macos").glob("*.yml"))


def recorded_facts(name: str) -> HostFacts:
    text = (DATA / "facts" / f"{name}.txt").read_text()
    return build_facts(split_sections(text), "~/.mlxops")


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_steps_from_recorded_facts(case: Path) -> None:
    spec = yaml.safe_load(case.read_text())
    facts = recorded_facts(spec["facts"])
    host = Host("mac", spec.get("vars") or {})
    steps = macos.steps_for(facts, host, spec.get("args") or {})
    expect = spec["expect"]
    assert steps.commands == expect["commands"]
    assert steps.needs_become == expect["needs_become"]
    assert len(steps.warnings) == len(expect["warnings"])
    for got, want in zip(steps.warnings, expect["warnings"], strict=True):
        assert want in got


def test_the_cases_cover_every_mac_recording_and_name_only_macs() -> None:
    """Each Darwin facts output has a case (a new recording is not left untested), and no
    case steps from a Linux one (the task skips those before its steps)."""
    named = {yaml.safe_load(case.read_text())["facts"] for case in CASES}
    darwin = {p.stem for p in (DATA / "facts").glob("*.txt") if recorded_facts(p.stem)
              .system == "Darwin"}
    assert darwin and named == darwin


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_a_case_says_only_what_the_test_reads(case: Path) -> None:
    spec = yaml.safe_load(case.read_text())
    assert set(spec) <= {"facts", "vars", "args", "expect"}
    assert set(spec["expect"]) == {"commands", "needs_become", "warnings"}


@pytest.mark.parametrize("args, problem", [
    ({"wired_share": 1.5}, "wired_share"),
    ({"wired_share": True}, "wired_share"),
    ({"disable_sleep": "yes"}, "disable_sleep"),
    ({"backend": "tcp"}, "backend"),
    ({"backend": "nccl"}, "backend"),  # CUDA only: the inventory refuses it too
])
def test_bad_args_are_refused(args, problem) -> None:
    with pytest.raises(ValueError, match=f"^{problem}: "):
        macos.check_args(args)


def test_wired_limit_explicit_share_or_none() -> None:
    facts = replace(HostFacts.unknown(), memory_bytes=64 * 1024**3)
    assert macos.wired_limit_mb(facts, 50000, 0.5) == 50000
    assert macos.wired_limit_mb(facts, None, 0.5) == 32768
    assert macos.wired_limit_mb(facts, None, None) is None
