"""The ``python`` task (MLX at the pinned version on every node) and ``skew`` (the same
mlx, Python and macOS build everywhere, and the same mlx-lm on the hosts that ask for it,
by the rules of :mod:`mlxops.readiness`).

``python`` reads what the facts task already probed — ``mlxops_python`` and, if present,
``mlxops_root/venv`` — so on a provisioned node it costs no round trip at all. Only when
neither has the pinned mlx does it make the venv and pip-install into it (from a wheelhouse
pushed by the controller when ``mlxops_wheelhouse`` is set, for nodes without internet).
Afterwards ``facts.python`` describes the interpreter the node will use.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from mlxops import archive, shell
from mlxops.hostfacts import HostFacts, Interpreter
from mlxops.node.protocol.layout import VENV_DIR, VENV_PYTHON
from mlxops.readiness import (
    AGREED,
    NOT_A_MAC,
    Versions,
    agreement,
    findings_of,
    joined,
    mlx_lm_findings,
    mlx_lm_pin,
    mlx_lm_pin_source,
    pinned_version,
)
from mlxops.tasks.base import Outcome, TaskContext, task
from mlxops.tasks.facts import PROBE, parse_probe

PIP_TIMEOUT = 1800.0
WHEEL_SUFFIXES = (".whl", ".tar.gz", ".zip")


def requirement(system: str | None, pin: str) -> str:
    """Apple Silicon wheels have Metal; on Linux the CPU build is the ``cpu`` extra."""
    return f"mlx=={pin}" if system == "Darwin" else f"mlx[cpu]=={pin}"


def decide(facts: HostFacts, pin: str) -> tuple[str, Interpreter | None]:
    """What to do: ``("ok", python)``, ``("venv", venv)`` (already has the pin), or
    ``("install", None)``; ``("missing", None)`` when there is no interpreter at all."""
    python, venv = facts.python, facts.venv
    if python.mlx == pin:
        return "ok", replace(python)
    if venv and venv.mlx == pin:
        return "venv", replace(venv)
    if not python.path and not (venv and venv.path):
        return "missing", None
    return "install", None


def install_command(facts: HostFacts, pin: str, packages: Sequence[str],
                    wheelhouse: str | None) -> str:
    """Make ``<root>/venv`` (unless it is there) and pip-install the pin into it, then
    probe it. ``wheelhouse``: a node directory to install from offline."""
    root = facts.root
    venv_python = f"{root}/{VENV_PYTHON}"
    base = facts.python.path or venv_python
    pip = [venv_python, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    if wheelhouse:
        pip += ["--no-index", "--find-links", wheelhouse]
    pip += [requirement(facts.system, pin), *packages]
    make_venv = (f"{{ test -x {shell.quote(venv_python)} || "
                 f"{shell.join([base, '-m', 'venv', f'{root}/{VENV_DIR}'])}; }}")
    return shell.and_then([
        shell.join(["mkdir", "-p", root]),
        make_venv,
        shell.join(pip),
        f"printf '%s\\n' {shell.quote(venv_python)}",
        shell.join([venv_python, "-c", PROBE]),
    ])


def wheelhouse_dir(host: Any) -> Path | None:
    """``mlxops_wheelhouse`` on the controller (``~`` expands, relative to the inventory)."""
    return host.local_path("mlxops_wheelhouse")


def wheelhouse_archive(directory: Path) -> bytes:
    """The wheelhouse's files as one gzip'd tar, streamed to the node in one command."""
    return archive.write_bytes(archive.from_files(
        (path.name, path) for path in sorted(directory.iterdir())
        if path.is_file() and path.name.endswith(WHEEL_SUFFIXES)), gzip=True)


def push_wheelhouse(ctx: TaskContext) -> tuple[str | None, str | None]:
    """Push ``mlxops_wheelhouse`` (when set) to ``<root>/wheelhouse`` on the node: its node
    path (None: not set, pip uses the index), and the problem when it failed."""
    wheels = wheelhouse_dir(ctx.host)
    if wheels is None:
        return None, None
    if not wheels.is_dir():
        return None, f"mlxops_wheelhouse: {wheels}: not a directory"
    node_wheelhouse = f"{ctx.facts.root}/wheelhouse"
    push = shell.and_then([shell.join(["mkdir", "-p", node_wheelhouse]),
                           shell.join(["tar", "-xzf", "-", "-C", node_wheelhouse])])
    result = ctx.conn.run(push, stdin=wheelhouse_archive(wheels), timeout=PIP_TIMEOUT)
    if not result.ok:
        return None, f"pushing the wheelhouse failed: {result.error_line()}"
    return node_wheelhouse, None


@task("python", args=["packages"])
def python_task(ctx: TaskContext, args: Mapping[str, Any]) -> Outcome:
    facts = ctx.facts
    if not facts:
        return Outcome.failed("no facts: run the 'facts' task first")
    pin = pinned_version(ctx.host)
    if not pin:
        return Outcome.failed("no mlx version to pin: set mlxops_mlx_version "
                              "(the controller has no mlx to copy it from)")
    action, info = decide(facts, pin)
    if action == "ok":
        return Outcome.ok(f"mlx {pin} at {info.path}")
    if action == "venv":
        facts.python = info  # the venv is what the node runs from now on
        return Outcome.ok(f"mlx {pin} in {info.path}")
    if action == "missing":
        return Outcome.failed(f"mlxops_python {ctx.host.python!r} not found on the node")
    have = facts.python.mlx
    what = f"mlx {have or 'missing'} -> {pin} in {facts.root}/{VENV_DIR}"
    if ctx.check:
        return Outcome.changed(f"would install {what}")
    node_wheelhouse, problem = push_wheelhouse(ctx)
    if problem:
        return Outcome.failed(problem)
    packages = list(args.get("packages") or [])
    result = ctx.conn.run(install_command(facts, pin, packages, node_wheelhouse),
                          timeout=PIP_TIMEOUT)
    if not result.ok:
        return Outcome.failed(f"installing {requirement(facts.system, pin)} failed: "
                              f"{result.error_line()}")
    info = parse_probe("\n".join(result.stdout.strip().splitlines()[-2:]))
    if not info or info.mlx != pin:
        return Outcome.failed(f"the venv reports mlx {info and info.mlx}, not {pin}")
    facts.python = info
    facts.venv = replace(info)
    return Outcome.changed(f"installed {what}")


def _check_python_args(args: Mapping[str, Any]) -> None:
    packages = args.get("packages", [])
    if not isinstance(packages, list) or not all(isinstance(p, str) and p for p in packages):
        raise ValueError("packages: must be a list of pip requirement strings")


python_task.check_args = _check_python_args  # type: ignore[attr-defined]


# --- skew ---------------------------------------------------------------------------------

def skew_table(expected: Mapping[str, Any], odd: Mapping[str, list[str]],
               values: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """A table for the console: the odd hosts, then the value the others agree on."""
    rows = [[h, *(str(values[h][k]) for k in AGREED)] for h in odd]
    rows.append([f"others ({len(values) - len(odd)})", *(str(expected.get(k))
                                                         for k in AGREED)])
    return {"title": "version skew", "columns": ["host", *AGREED.values()], "rows": rows,
            "marks": {h: [1 + list(AGREED).index(k) for k in keys]
                      for h, keys in odd.items()}}


@task("skew", scope="cluster")
def skew_task(contexts: Mapping[str, TaskContext], args: Mapping[str, Any]
              ) -> dict[str, Outcome]:
    facts = {name: ctx.facts for name, ctx in contexts.items() if ctx.facts is not None}
    unread = {name: Outcome.skipped("no facts (the facts task was skipped)")
              for name in contexts if name not in facts}
    if not facts:
        return unread
    first = next(iter(contexts.values()))
    agreed = agreement([Versions.from_facts(n, f) for n, f in facts.items()],
                       pinned_version(first.host))
    expected, odd = agreed.expected, agreed.odd
    lm_findings = _mlx_lm_skew(contexts, facts)
    if lm_findings:
        # mlx-lm's skew fails its hosts with its own line (mlx's table stays mlx's).
        for name in facts:
            mine = findings_of(lm_findings, name)
            if mine:
                odd.setdefault(name, [])
    if not odd:
        summary = ", ".join(f"{AGREED[k]} {v}" for k, v in expected.items() if v != NOT_A_MAC)
        return {**unread, **{name: Outcome.ok(summary) for name in facts}}
    table = skew_table(expected, odd, agreed.values)
    out = dict(unread)
    for name in facts:
        if name in odd:
            found, fix = joined(findings_of(agreed.findings, name)
                                + findings_of(lm_findings, name))
            out[name] = Outcome.failed(f"{found}: {fix}", table=table)
        else:
            out[name] = Outcome.ok("agrees", table=table)
    return out



def _mlx_lm_skew(contexts: Mapping[str, TaskContext], facts: Mapping[str, HostFacts]
                 ) -> list:
    """mlx-lm's rule over the hosts whose inventory asks for it (mlxops_mlx_lm), pinned
    by the first of them."""
    asking = [name for name in facts if contexts[name].host.var("mlxops_mlx_lm") is not False]
    if not asking:
        return []
    first = contexts[asking[0]].host
    return mlx_lm_findings([Versions.from_facts(n, facts[n]) for n in asking],
                           mlx_lm_pin(first), mlx_lm_pin_source(first))
