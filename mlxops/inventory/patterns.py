"""Ansible host patterns, as ``--limit`` and a job's ``hosts:`` take them.

``all`` / ``*``; host or group names; ``a,b`` or ``a:b`` (or, as Ansible, ``a b``) lists;
globs (``web*``, ``mac-[a-c]``); ``~regex`` (matched from the start, like Ansible); ``!x``
excludes and ``&x`` intersects; ``web[0]``, ``web[-1]``, ``web[1:]``, ``web[0:2]`` pick hosts
by their position in what ``web`` matches, in Ansible's order (see :func:`ansible_order`).
Like Ansible, unions apply first, then intersections, then exclusions, whatever order they
are written in; a pattern of only ``!``/``&`` parts starts from ``all``.

Where mlxops differs from ansible-core 2.19, on purpose (README, "Inventory"):

* the result is always in inventory order (the order hosts first appear in the file),
  whatever the order of the pattern's parts: ranks are numbered in that order. Ansible
  lists a union in the order it is written, and a group's hosts breadth first;
* a name that is neither a host nor a group is refused, also after ``!`` or ``&`` (Ansible
  warns and ignores it: a typo in ``macs:!mac3`` would run on mac3);
* Ansible's implicit ``localhost`` is not there: list it (``ansible_connection: local``);
* a subscript Ansible resolves by chance (the position among hosts of sub-groups of
  sub-groups, which Ansible walks in an arbitrary order), a position past the end, a
  range that ends before it starts, and the removed ``[x-y]`` form are refused.
"""

from __future__ import annotations

import difflib
import fnmatch
import re
from typing import TYPE_CHECKING

from mlxops.errors import UserError, bad_input

if TYPE_CHECKING:
    from mlxops.inventory.model import Inventory

# Ansible's split: on ',' if there is one, else on ':' or whitespace outside [...] (so
# `mac-[1:3]` and `web[0:2]` hold together).
_PARTS = re.compile(r"(?:[^\s:\[\]]|\[[^\]]*\])+")
# Ansible's PATTERN_WITH_SUBSCRIPT (ansible/inventory/manager.py): a pattern ending in
# [index] or [start:end] / [start:] (or the removed [start-end]).
_SUBSCRIPT = re.compile(r"^(.+)\[(?:(-?[0-9]+)|([0-9]+)([:-])([0-9]*))\]$")
_GLOB_CHARS = set("*?[")
_LOCALHOST = ("localhost", "127.0.0.1", "::1")  # Ansible's implicit localhost names


def split(pattern: str) -> list[str]:
    """``'a:b,!c'`` -> ``['a:b', '!c']``; ``'a:!b'`` and ``'a !b'`` -> ``['a', '!b']``."""
    if "," in pattern:
        parts = pattern.split(",")
    elif ":" not in pattern and not any(c.isspace() for c in pattern.strip()):
        parts = [pattern]  # kept whole, so a stray '[' reaches the regex/glob and is reported
    else:
        parts = _PARTS.findall(pattern)
    return [p.strip() for p in parts if p.strip()]


def _is_plain(term: str) -> bool:
    return not term.startswith("~") and not (_GLOB_CHARS & set(term))


def _compile(term: str, source: str) -> re.Pattern[str]:
    if term.startswith("~"):
        try:
            return re.compile(term[1:])
        except re.error as exc:
            raise bad_input(source, None, f"invalid regular expression {term!r}: {exc}") from None
    return re.compile(fnmatch.translate(term))


# --- Ansible's order, for subscripts ------------------------------------------------------


def ansible_order(inv: Inventory, group: str, source: str) -> list[str]:
    """A group's hosts in Ansible's order (``Group.get_hosts``): its own hosts, then its
    children's, then each further generation's, without repeats.

    Ansible walks a generation in an arbitrary order (a set); when more than one group of a
    generation brings sub-groups, the order of their hosts is not defined, and a position
    in it would be a guess: refused.
    """
    order = [group, *inv.groups[group].children]
    seen = set(order)
    generation = order
    while generation:
        blocks = [[c for c in inv.groups[g].children if c not in seen] for g in generation]
        distinct = {tuple(b) for b in blocks if b}
        if len(distinct) > 1:
            raise bad_input(source, None, f"the position of a host in {group!r} is not defined: "
                            f"Ansible orders the hosts of {group!r}'s nested sub-groups "
                            "arbitrarily; name the hosts or a smaller group instead")
        new = list(dict.fromkeys(c for b in blocks for c in b))
        seen.update(new)
        order.extend(new)
        generation = new
    hosts = (h for g in order for h in inv.groups[g].hosts)
    return list(dict.fromkeys(hosts))


def _subscript(inv: Inventory, term: str, source: str) -> list[str] | None:
    """Hosts of a subscripted term (``web[1]``, ``web[0:2]``), or None when it has none."""
    m = _SUBSCRIPT.match(term)
    if term.startswith("~") or not m:
        return None  # a regex keeps its brackets, as in Ansible
    expr, index, start, sep, end = m.groups()
    if sep == "-":
        raise bad_input(source, None, f"{term!r}: Ansible reads [{start}-{end}] as the positions "
                        f"{start} to {end} of {expr!r}, a form it has removed; write "
                        f"{expr}[{start}:{end}], or name the hosts")
    # Ansible's _enumerate_matches: every matching group's hosts (repeats kept), then the
    # matching hosts when no group matched or the pattern is a glob.
    regex = _compile(expr, source)
    groups = [g for g in inv.groups if regex.match(g)]
    matches = [h for g in groups for h in ansible_order(inv, g, source)]
    if not groups or any(c in expr for c in ".?*["):
        matches += [h for h in inv.hosts if regex.match(h)]
    if not matches:
        if _is_plain(expr):
            raise _no_such_name(inv, expr, source)
        raise bad_input(source, None, f"{expr!r} (subscripted {term!r}) matches no hosts "
                                      f"in {inv.path}")
    count = len(matches)
    if index is not None:
        position = int(index)
        if not -count <= position < count:
            raise bad_input(source, None, f"{term!r}: no position {position} in {expr!r}, which "
                            f"has {count} host{'s' if count != 1 else ''} (0 to {count - 1})")
        return [matches[position]]
    first, last = int(start), int(end) if end else count - 1
    if first >= count:
        raise bad_input(source, None, f"{term!r}: {expr!r} has {count} host"
                        f"{'s' if count != 1 else ''} (positions 0 to {count - 1})")
    if last < first:
        raise bad_input(source, None, f"{term!r}: the range ends before it starts")
    return matches[first:last + 1]  # a range past the end stops at it, as in Ansible


# --- selection ----------------------------------------------------------------------------


def _match_term(inv: Inventory, term: str, source: str, operator: str = "") -> list[str]:
    """Host names one term (without its ``operator``, ! or &) selects, unordered."""
    if term in ("all", "*"):
        return list(inv.hosts)
    if term in inv.hosts and term not in inv.groups:
        return [term]
    picked = _subscript(inv, term, source)
    if picked is not None:
        return picked
    regex = _compile(term, source)
    names: dict[str, None] = {}
    for group in inv.groups:
        if regex.match(group):
            names.update(dict.fromkeys(inv.group_hosts(group)))
    for host in inv.hosts:
        if regex.match(host):
            names[host] = None
    if not names and _is_plain(term) and term not in inv.groups:
        raise _no_such_name(inv, term, source, operator)
    return list(names)


def _no_such_name(inv: Inventory, term: str, source: str, operator: str = "") -> UserError:
    close = difflib.get_close_matches(term, [*inv.hosts, *inv.groups], n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    if operator == "!" and not close:
        # Ansible warns and ignores it; a typo there would keep the host meant to be left out.
        hint = " (after '!' too: a misspelt exclusion would keep that host)"
    if term in _LOCALHOST:
        hint = (" (Ansible's implicit localhost is not supported: list it in the inventory "
                "with ansible_connection: local)")
    return bad_input(source, None, f"no host or group named {term!r} in {inv.path}{hint}")


def select(inv: Inventory, pattern: str, source: str) -> list[str]:
    """Names of the hosts ``pattern`` selects, in inventory order; never empty."""
    terms = split(pattern)
    if not terms:
        raise bad_input(source, None, f"empty host pattern {pattern!r}")
    unions = [t for t in terms if t[0] not in "!&"] or ["all"]
    intersections = [t[1:] for t in terms if t[0] == "&"]
    exclusions = [t[1:] for t in terms if t[0] == "!"]

    chosen: set[str] = set()
    for term in unions:
        chosen.update(_match_term(inv, term, source))
    for term in intersections:
        chosen.intersection_update(_match_term(inv, term, source, "&"))
    for term in exclusions:
        chosen.difference_update(_match_term(inv, term, source, "!"))

    result = [name for name in inv.hosts if name in chosen]
    if not result:
        raise bad_input(source, None, f"host pattern {pattern!r} selects no hosts in {inv.path}")
    return result
