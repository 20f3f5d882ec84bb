"""The python and skew tasks' decisions, from facts (pure: no host)."""

from __future__ import annotations

import shlex
from dataclasses import replace

from mlxops.hostfacts import HostFacts, Interpreter
from mlxops.readiness import Versions, agreement
from mlxops.tasks import python as P

PY = Interpreter(path="/usr/bin/python3", version="3.11.7", mlx="0.30.0")
VENV = Interpreter(path="/h/.mlxops/venv/bin/python", version="3.11.7", mlx="0.32.4")


def facts(**values) -> HostFacts:
    return replace(HostFacts.unknown(), **values)


def test_decide() -> None:
    assert P.decide(facts(python=replace(PY, mlx="0.32.4")), "0.32.4")[0] == "ok"
    assert P.decide(facts(python=PY, venv=VENV), "0.32.4") == ("venv", VENV)
    assert P.decide(facts(python=PY, venv=None), "0.32.4") == ("install", None)
    assert P.decide(facts(python=Interpreter.none(), venv=None), "0.32.4") == ("missing", None)


def test_requirement_per_system() -> None:
    assert P.requirement("Darwin", "0.32.4") == "mlx==0.32.4"
    assert P.requirement("Linux", "0.32.4") == "mlx[cpu]==0.32.4"


def test_install_command_offline_and_quoted() -> None:
    node = facts(root="/Users/a b/.mlxops", system="Darwin", python=PY)
    cmd = P.install_command(node, "0.32.4", ["numpy"], "/Users/a b/.mlxops/wheelhouse")
    words = shlex.split(cmd.replace("{", "").replace("}", "").replace(";", " "))
    assert "/Users/a b/.mlxops/venv/bin/python" in words
    assert ["--no-index", "--find-links", "/Users/a b/.mlxops/wheelhouse"] == \
        words[words.index("--no-index"):words.index("--no-index") + 3]
    assert "mlx==0.32.4" in words and "numpy" in words
    online = P.install_command(node, "0.32.4", [], None)
    assert "--no-index" not in online


def test_wheelhouse_archive(tmp_path) -> None:
    import io
    import tarfile

    (tmp_path / "mlx-0.32.4-cp311-none-any.whl").write_bytes(b"w")
    (tmp_path / "notes.txt").write_text("skip me")
    with tarfile.open(fileobj=io.BytesIO(P.wheelhouse_archive(tmp_path))) as tar:
        assert tar.getnames() == ["mlx-0.32.4-cp311-none-any.whl"]


def _facts(mlx, py="3.11.7", build="23E224", system="Darwin"):
    return facts(system=system, macos_build=build,
                 python=Interpreter(path="/p", version=py, mlx=mlx))


def find_skew(nodes: dict, pin: str):
    """The skew task's question: the readiness agreement over the hosts' facts."""
    agreed = agreement([Versions.from_facts(n, f) for n, f in nodes.items()], pin)
    return agreed.expected, agreed.odd, agreed.values


def test_no_skew() -> None:
    expected, odd, _ = find_skew({f"n{i}": _facts("0.32.4") for i in range(4)}, "0.32.4")
    assert odd == {} and expected == {"mlx": "0.32.4", "python": "3.11", "macos_build": "23E224"}


def test_skew_names_the_odd_hosts() -> None:
    nodes = {f"n{i}": _facts("0.32.4") for i in range(5)}
    nodes["n2"] = _facts("0.31.0")
    nodes["n4"] = _facts("0.32.4", py="3.12.1", build="24B83")
    expected, odd, values = find_skew(nodes, "0.32.4")
    assert odd == {"n2": ["mlx"], "n4": ["python", "macos_build"]}
    table = P.skew_table(expected, odd, values)
    assert [r[0] for r in table["rows"]] == ["n2", "n4", "others (3)"]
    assert table["marks"]["n2"] == [1]


def test_skew_tie_prefers_the_pin_and_ignores_linux_builds() -> None:
    nodes = {"a": _facts("0.31.0", system="Linux", build=None),
             "b": _facts("0.32.4", system="Linux", build=None)}
    expected, odd, _ = find_skew(nodes, "0.32.4")
    assert expected["mlx"] == "0.32.4" and odd == {"a": ["mlx"]}


def test_skew_names_a_host_whose_mlx_lm_differs_among_those_that_ask_for_it():
    from mlxops.inventory.model import Host
    from mlxops.tasks.base import TaskContext

    def ctx(name, mlx_lm, asked):
        host = Host(name, {"mlxops_mlx_lm": asked} if asked else {})
        node = _facts("0.32.4", system="Linux")
        node.python = replace(node.python, mlx_lm=mlx_lm)
        return TaskContext(host=host, conn=None, inventory=None, hosts=[], facts=node)

    contexts = {"a": ctx("a", "0.30.0", "0.30.0"), "b": ctx("b", "0.29.0", "0.30.0"),
                "c": ctx("c", None, False)}   # c does not ask: not compared
    out = P.skew_task(contexts, {})
    assert (out["a"].status, out["c"].status) == ("ok", "ok")
    assert out["b"].status == "failed"
    assert out["b"].message.startswith("mlx-lm 0.29.0, mlxops_mlx_lm 0.30.0, mlx-lm 0.29.0, "
                                       "others 0.30.0: set mlxops_mlx_lm")
