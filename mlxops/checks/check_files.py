"""What provision leaves on each node is there and current: ``env.sh``, the hostfiles, the
synced code. Compared with what provision itself would write now (its own rendering and
its own sync manifest), never with a second copy of the rules."""

from __future__ import annotations

import json

from mlxops import render
from mlxops.errors import UserError
from mlxops.inventory.variables import ring_order_line
from mlxops.node.protocol import RING
from mlxops.tasks.env import env_path, render_env
from mlxops.tasks.hostfiles import hostfile_path, render_all
from mlxops.tasks.sync import code_path

PROVISION = "run mlxops provision"


def _first_difference(have: bytes, want: bytes) -> int:
    """The first line (from 1) where two texts differ. Values are never shown: env.sh may
    hold secrets a CI log must not."""
    a, b = have.splitlines(), want.splitlines()
    for n, (x, y) in enumerate(zip(a, b, strict=False), start=1):
        if x != y:
            return n
    return min(len(a), len(b)) + 1


def check_env_file(node):
    """``<root>/env.sh`` exists, mode 600, equal to what provision renders for this host."""
    path = env_path(node.host)
    content, mode = node.need(node.files.get(path, "not read"), path)
    if content is None:
        raise node.fail(f"{path} missing", PROVISION)
    try:
        want = render_env(node.host, node.facts).encode()
    except ValueError as exc:
        raise node.fail(str(exc)) from None
    if content != want:
        line = _first_difference(content, want)
        raise node.fail(f"{path} differs from what provision renders (line {line})", PROVISION)
    if mode != 0o600:
        raise node.fail(f"{path} has mode {mode:o}, want 600", PROVISION)


def check_hostfiles(node, cluster):
    """``<root>/hostfiles/``: one file per backend the inventory describes, each as the
    hostfiles task renders it for the whole inventory, or for the hosts provision may have
    been limited to (the job's, the checked ones)."""
    choices = cluster.target.hostfiles
    if isinstance(choices, str):
        raise node.fail(f"the hostfiles cannot be rendered: {choices}", "fix the inventory")
    found = [_hostfile_problems(node, rendered, which) for which, rendered in choices]
    if not all(found):
        return
    reordered = _reordered(node, cluster)
    if reordered:
        which, order = reordered
        raise node.fail(f"{hostfile_path(node.host, RING)} lists {which} in another order "
                        f"({', '.join(order)}; mlxops bench --apply?)",
                        f"to keep it, add under all: vars: {ring_order_line(order)}; else "
                        f"{PROVISION}")
    raise node.fail("; ".join(found[0]), PROVISION)


def _reordered(node, cluster) -> tuple[str, list[str]] | None:
    """``(which hosts, their order)`` when every hostfile on the node is what the hostfiles
    task renders for one of the sets of hosts put in another order, as ``mlxops bench
    --apply`` writes them. The order is read off ``ring.json`` and checked by rendering."""
    try:
        entries = json.loads(_content(node, hostfile_path(node.host, RING)))["hosts"]
    except (TypeError, ValueError, KeyError):
        return None
    for which, hosts in cluster.target.hostfile_sets:
        ranks = render.rank_hosts(hosts)  # one rendered entry per rank, in this order
        try:
            rendered = json.loads(render.launch_hostfile(hosts, RING))["hosts"]
            order = list(dict.fromkeys(ranks[rendered.index(e)].name for e in entries))
            rendered = render_all(render.in_order(hosts, order), cluster.target.inventory.path)
        except (KeyError, TypeError, ValueError, UserError):
            continue  # an entry of no host of this set (list.index: ValueError)
        if all(_content(node, hostfile_path(node.host, b)) == text.encode()
               for b, text in rendered.items()):
            return which, order
    return None


def _content(node, path: str) -> bytes | None:
    """A file the node's answer carried, or None (missing, or not read)."""
    found = node.files.get(path)
    return found[0] if isinstance(found, tuple) else None


def _hostfile_problems(node, rendered: dict[str, str], which: str) -> list[str]:
    problems = []
    for backend, text in rendered.items():
        path = hostfile_path(node.host, backend)
        content, mode = node.need(node.files.get(path, "not read"), path)
        if content is None:
            problems.append(f"{path} missing")
        elif content != text.encode():
            problems.append(f"{path} does not match {which}")
        elif mode != 0o644:
            problems.append(f"{path} has mode {mode:o}, want 644")
    return problems


def check_synced_code(node, cluster):
    """``<root>/code`` holds exactly the controller's bundle (the sync task's manifest
    comparison, in check mode)."""
    path = code_path(node.host)
    report = node.need(node.code, path)
    if not report.has_changes:
        return
    parts = [f"{len(paths)} {what}" for what, paths in (
        ("missing", report.added), ("changed", report.changed), ("extra", report.deleted))
        if paths]
    example = (report.changed + report.added + report.deleted)[0]
    fix = (f"mlxops launch {cluster.target.job.path.name} syncs it, or {PROVISION}"
           if cluster.target.job is not None else PROVISION)
    raise node.fail(f"{path} is not the controller's code: {', '.join(parts)} "
                    f"(e.g. {example})", fix)
