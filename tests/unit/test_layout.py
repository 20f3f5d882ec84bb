"""The unit tests find their module (issue 27): a test of a package mlxops/<P>/ lives in
tests/unit/<P>/, so each sub-folder of tests/unit/ (but the shared data/) names a package;
and the folders stay plain folders, because pytest's prepend import mode and the bare-name
helper imports (``from node_answers import ...``; tests/unit/conftest.py) need that: no
``__init__.py`` under tests/ (unique basenames, the other half, are test_lint.py's)."""

from __future__ import annotations

from pathlib import Path

UNIT = Path(__file__).resolve().parent
ROOT = UNIT.parents[1]
SHARED = {"data", "__pycache__"}


def test_each_sub_folder_mirrors_a_package():
    # mlxops/jobs/ has no __init__.py (a namespace package): a package is a folder of modules
    packages = {p.parent.name for p in (ROOT / "mlxops").glob("*/*.py")}
    folders = {p.name for p in UNIT.iterdir() if p.is_dir()} - SHARED
    assert folders - packages == set()


def test_no_folder_of_tests_is_a_package():
    assert sorted((ROOT / "tests").rglob("__init__.py")) == []

