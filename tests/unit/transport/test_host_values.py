"""Per-host results carry what the work returned for each host (as Fabric's GroupResult)."""

from __future__ import annotations

from types import SimpleNamespace

from mlxops.transport import HostResult, HostUnreachable, run_parallel
from mlxops.transport.results import CHANGED, OK, UNREACHABLE


def _hosts(*names: str) -> list[SimpleNamespace]:
    return [SimpleNamespace(name=n) for n in names]


def test_a_plain_return_value_is_an_ok_result_carrying_it():
    results = run_parallel(_hosts("a", "b"), lambda host: {"host": host.name, "n": 1})
    assert results["a"].status == OK and results["a"].value == {"host": "a", "n": 1}
    assert results.succeeded_values() == {"a": {"host": "a", "n": 1},
                                          "b": {"host": "b", "n": 1}}


def test_values_are_those_of_the_hosts_that_succeeded_in_host_order():
    def work(host):
        if host.name == "b":
            raise HostUnreachable("b", "connection refused")
        if host.name == "c":
            return HostResult("c", CHANGED, "new key", value="c's value")
        return host.name.upper()

    results = run_parallel(_hosts("d", "c", "b", "a"), work)
    assert results["b"].status == UNREACHABLE and results["b"].value is None
    assert list(results.succeeded_values().items()) == [
        ("d", "D"), ("c", "c's value"), ("a", "A")]


def test_a_host_result_returned_as_is_keeps_its_status():
    results = run_parallel(_hosts("a"), lambda host: HostResult(host.name, CHANGED))
    assert results["a"].status == CHANGED and results["a"].value is None
