"""When init stops listening for ``_ssh._tcp`` answers (mlxops/init/discover.py): a quiet
interval after the last new instance, the window as its bound."""

import pytest

from mlxops.init.discover import listening_ends


def test_listening_ends_a_quiet_interval_after_the_last_new_answer():
    assert listening_ends(100.0, 3.0, 0.5, None) == 103.0     # nothing heard: the window
    assert listening_ends(100.0, 3.0, 0.5, 100.09) == pytest.approx(100.59)  # by 90 ms
    assert listening_ends(100.0, 3.0, 0.5, 102.8) == 103.0    # a late one: still the bound
