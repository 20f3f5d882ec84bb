"""An installed mlxops finds templates/ and playbooks/ without a checkout (docs/architecture.md)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.tools  # pip builds in isolation: setuptools comes from the package index
def test_the_wheel_carries_templates_playbooks_and_the_node_code(tmp_path):
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
         "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-2000:]
    [wheel] = tmp_path.glob("mlxops-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for template in (ROOT / "templates").iterdir():
        assert f"mlxops/_data/templates/{template.name}" in names
    assert "mlxops/_data/playbooks/provision.yml" in names
    assert {"mlxops/trainer/__main__.py", "mlxops/node/__main__.py"} <= names
    # The dashboard and the report: everything their pages need, nothing from a CDN.
    static = ROOT / "mlxops" / "monitor" / "static"
    assert {f"mlxops/monitor/static/{p.name}" for p in static.iterdir()} <= names
