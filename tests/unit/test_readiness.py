"""The readiness rules as data (data/readiness/cases.yml), and the three places that ask
them (pre-flight, mlxops check, provision's skew task) giving the same answer."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mlxops import readiness as R

CASES = yaml.safe_load((Path(__file__).parent / "data" / "readiness" / "cases.yml")
                       .read_text())


def versions(host: str, spec: str) -> R.Versions:
    words = [None if w == "-" else w for w in spec.split()]
    return R.Versions(host, *words)


def judge(case: dict) -> list[str]:
    """Every rule, as pre-flight (no pin) or check (a pin) asks them."""
    nodes = [versions(h, spec) for h, spec in case["hosts"].items()]
    pin = case.get("pin")
    lines = [f.line for n in nodes for f in R.mlx_findings(n, pin)]
    keys = case.get("keys", tuple(R.AGREED))
    return lines + [f.line for f in R.agreement(nodes, pin, keys).findings]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_case(case: dict) -> None:
    assert judge(case) == case["findings"]


@pytest.mark.parametrize("version, series", [
    ("3.11.7", "3.11"), ("3.9.18", "3.9"), ("3.10.0", "3.10"), ("3", "3"), (None, None),
    ("", None),
])
def test_python_series(version, series) -> None:
    assert R.python_series(version) == series


def test_joined_is_one_line_per_host() -> None:
    agreed = R.agreement([versions("a", "/p 3.11.7 0.29.2 Darwin 24F74"),
                          versions("b", "/p 3.11.7 0.29.2 Darwin 24F74"),
                          versions("c", "/p 3.12.1 0.28.0 Darwin 23E224")])
    found, fix = R.joined(R.findings_of(agreed.findings, "c"))
    assert found == ("mlx 0.28.0, others 0.29.2, python 3.12, others 3.11, "
                     "macOS build 23E224, others 24F74")
    assert fix == R.AGREE_FIX
    assert agreed.odd == {"c": ["mlx", "python", "macos_build"]}


MLX_LM_CASES = yaml.safe_load((Path(__file__).parent / "data" / "readiness" / "mlx_lm.yml")
                              .read_text())


@pytest.mark.parametrize("case", MLX_LM_CASES, ids=[c["name"] for c in MLX_LM_CASES])
def test_mlx_lm_case(case: dict) -> None:
    nodes = []
    for host, spec in case["hosts"].items():
        interpreter, mlx_lm = spec.split()
        nodes.append(R.Versions(host, interpreter, "3.11.7", "0.32.4", "Linux",
                                mlx_lm=None if mlx_lm == "-" else mlx_lm))
    findings = R.mlx_lm_findings(nodes, case.get("pin"), case.get("source", "controller"))
    assert [f.line for f in findings] == case["findings"]
