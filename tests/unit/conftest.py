"""Fixtures shared by the unit tests."""

from __future__ import annotations

import pytest
from node_answers import Processes


@pytest.fixture
def procs():
    """Processes for pid files; the live ones are killed after the test."""
    procs = Processes()
    yield procs
    procs.close()
