"""The job display speaks the protocol's state vocabulary: every state has its colour."""

from __future__ import annotations

from mlxops.console import STATE_STYLE
from mlxops.node.protocol import JOB_STATES, RANK_STATES


def test_every_rank_and_job_state_has_a_style():
    assert set(STATE_STYLE) == set(RANK_STATES) | set(JOB_STATES)
