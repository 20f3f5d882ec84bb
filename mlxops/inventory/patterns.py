"""Ansible host patterns, as ``--limit`` and a job's ``hosts:`` take them.

``all`` / ``*``; host or group names; ``a,b`` or ``a:b`` lists; globs (``web*``,
``mac-[0-9]``); ``~regex`` (matched from the start, like Ansible); ``!x`` excludes and
``&x`` intersects. Like Ansible, unions apply first, then intersections, then exclusions,
whatever order they are written in; a pattern of only ``!``/``&`` parts starts from
``all``. The result is always in inventory order.

One difference from Ansible, on purpose: ``name[0:2]`` subscripts are not supported and
``mac-[0-9]`` is a glob character class.
"""

from __future__ import annotations

import difflib
import fnmatch
import re
from typing import TYPE_CHECKING

from mlxops.errors import UserError, bad_input

if TYPE_CHECKING:
    from mlxops.inventory.model import Inventory

# Ansible's split: on ',' if there is one, else on ':' outside [...] (so `mac-[1:3]` holds).
_COLON_PARTS = re.compile(r"(?:[^\s:\[\]]|\[[^\]]*\])+")
_GLOB_CHARS = set("*?[")


def split(pattern: str) -> list[str]:
    """``'a:b,!c'`` -> ``['a:b', '!c']``; ``'a:!b'`` -> ``['a', '!b']``."""
    if "," in pattern:
        parts = pattern.split(",")
    elif ":" not in pattern:
        parts = [pattern]  # kept whole, so a stray '[' reaches the regex/glob and is reported
    else:
        parts = _COLON_PARTS.findall(pattern)
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


def _match_term(inv: Inventory, term: str, source: str) -> list[str]:
    """Host names one term (without its ! or &) selects, unordered-deduplicated."""
    if term in ("all", "*"):
        return list(inv.hosts)
    if term in inv.hosts and term not in inv.groups:
        return [term]
    regex = _compile(term, source)
    names: dict[str, None] = {}
    for group in inv.groups:
        if regex.match(group):
            names.update(dict.fromkeys(inv.group_hosts(group)))
    for host in inv.hosts:
        if regex.match(host):
            names[host] = None
    if not names and _is_plain(term) and term not in inv.groups:
        raise _no_such_name(inv, term, source)
    return list(names)


def _no_such_name(inv: Inventory, term: str, source: str) -> UserError:
    close = difflib.get_close_matches(term, [*inv.hosts, *inv.groups], n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
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
        chosen.intersection_update(_match_term(inv, term, source))
    for term in exclusions:
        chosen.difference_update(_match_term(inv, term, source))

    result = [name for name in inv.hosts if name in chosen]
    if not result:
        raise bad_input(source, None, f"host pattern {pattern!r} selects no hosts in {inv.path}")
    return result
