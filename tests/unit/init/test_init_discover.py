"""When init stops listening for ``_ssh._tcp`` answers (mlxops/init/discover.py): a quiet
interval after the last new instance, the window as its bound."""

import pytest

from mlxops.init.discover import listening_ends


def test_listening_ends_a_quiet_interval_after_the_last_new_answer():
    assert listening_ends(100.0, 3.0, 0.5, None) == 103.0     # nothing heard: the window
    assert listening_ends(100.0, 3.0, 0.5, 100.09) == pytest.approx(100.59)  # by 90 ms
    assert listening_ends(100.0, 3.0, 0.5, 102.8) == 103.0    # a late one: still the bound


class _Info:
    def __init__(self, address: str) -> None:
        self.port, self.server, self._address = 22, "x.local.", address

    def parsed_addresses(self) -> list[str]:
        return [self._address]


def test_a_browse_hands_on_the_answers_heard_before_and_after_its_callback_is_set(
        monkeypatch):
    """init starts the listening before the pipeline that takes its answers exists: an
    answer resolved before the callback is set is handed on when it is set, a later one
    as it comes, each once; ``wait`` returns them all sorted, and ``close`` repeats."""
    import zeroconf

    from mlxops.init.discover import SERVICE, Browse, Found

    made = {}

    class FakeZeroconf:
        def __init__(self, **kwargs) -> None:
            self.closed = 0

        def get_service_info(self, type_, name, timeout):
            return _Info({"b": "10.0.0.2", "a": "10.0.0.1"}[name[0]])

        def close(self) -> None:
            self.closed += 1

    class FakeBrowser:
        def __init__(self, zc, type_, handlers) -> None:
            made["add"], self.cancelled = handlers[0], 0

        def cancel(self) -> None:
            self.cancelled += 1

    monkeypatch.setattr(zeroconf, "Zeroconf", FakeZeroconf)
    monkeypatch.setattr(zeroconf, "ServiceBrowser", FakeBrowser)
    browse = Browse(seconds=5, quiet=0.01)
    made["add"](None, SERVICE, f"b.{SERVICE}", None)
    browse._resolving[0].result()  # resolved, no callback yet
    heard: list[Found] = []
    browse.hand_to(heard.append)
    assert [f.name for f in heard] == ["b"]
    made["add"](None, SERVICE, f"a.{SERVICE}", None)
    made["add"](None, SERVICE, f"b.{SERVICE}", None)  # heard again: not resolved again
    found = browse.wait()
    assert [f.name for f in found] == ["a", "b"] and sorted(heard) == found
    browse.close()
    browse.close()
    assert browse._zc.closed == 2
