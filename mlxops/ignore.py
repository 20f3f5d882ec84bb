"""gitignore-style exclusion rules, with no dependency beyond ``re``.

:class:`Ignore` answers one question, "is this relative path excluded?", the way git reads
``.gitignore`` files: the last matching rule wins, ``!`` re-includes, and an excluded
directory hides everything under it (a file in it cannot be re-included). Rules read from
a ``.gitignore`` in a subdirectory apply under that directory only.

Covered: ``#`` comments, ``!`` negation, trailing ``/`` (directories only), leading or
inner ``/`` (anchored to the file's directory), ``*``, ``?``, ``[...]`` (``[!...]``
negated), ``**`` (leading, trailing, inner), ``\\`` escapes, trailing spaces (kept when
escaped).

Why not ``pathspec``: its gitignore patterns match *files*, a pattern that names a directory
also naming everything under it (``!/build`` re-includes ``build/x`` too), which is not
what a walker that prunes directories needs. Ours is held equal to ``git check-ignore`` on
200 generated trees and rule sets, a subdirectory's ``.gitignore`` included
(``tests/unit/test_ignore.py``).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path


def _class_end(pattern: str, start: int) -> int:
    """Index of the ``]`` closing the class opened at ``start`` (-1: a literal ``[``)."""
    i = start + 1
    if pattern.startswith("!", i):
        i += 1
    if pattern.startswith("]", i):
        i += 1  # a leading ] is part of the class
    return pattern.find("]", i)


def _translate(pattern: str) -> str:
    """One gitignore glob (no leading ``!``, no trailing ``/``) -> regex over a rel path."""
    anchored = "/" in pattern
    pattern = pattern.lstrip("/")
    out, i, n = [], 0, len(pattern)
    while i < n:
        if pattern.startswith("**/", i) and (i == 0 or pattern[i - 1] == "/"):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i) and i + 2 == n and (i == 0 or pattern[i - 1] == "/"):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[" and _class_end(pattern, i) > 0:
            end = _class_end(pattern, i)
            body = pattern[i + 1:end]
            if body.startswith("!"):
                body = "^" + body[1:]
            out.append("[" + body.replace("\\", "\\\\") + "]")
            i = end + 1
        elif pattern[i] == "\\" and i + 1 < n:
            out.append(re.escape(pattern[i + 1]))
            i += 2
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    prefix = "" if anchored else "(?:.*/)?"
    return "^" + prefix + "".join(out) + "$"


@dataclass(frozen=True)
class _Rule:
    base: str            # directory of the .gitignore, relative ("" at the top)
    regex: re.Pattern
    negate: bool
    dir_only: bool


class Ignore:
    """An ordered set of gitignore rules; see the module doc for what a pattern may hold."""

    def __init__(self, patterns: Iterable[str] = ()):
        self._rules: list[_Rule] = []
        self.add(patterns)

    def add(self, lines: Iterable[str], base: str = "") -> None:
        """Append the rules of ``lines`` (a .gitignore's lines) found in directory ``base``
        (relative, ``""`` for the top): they apply to paths under ``base`` only."""
        for raw in lines:
            line = raw.rstrip("\n")
            if not line.endswith("\\ "):
                line = line.rstrip(" ")
            if not line or line.startswith("#"):
                continue
            negate = line.startswith("!")
            if negate:
                line = line[1:]
            dir_only = line.endswith("/")
            line = line.rstrip("/")
            if not line:
                continue
            self._rules.append(_Rule(base, re.compile(_translate(line), re.DOTALL),
                                     negate, dir_only))

    def add_file(self, path: Path, base: str = "") -> None:
        """:meth:`add` the lines of a .gitignore file; an unreadable one adds nothing."""
        try:
            self.add(path.read_text(errors="replace").splitlines(), base)
        except OSError:
            pass

    def extend(self, other: Ignore) -> None:
        """Append ``other``'s rules after this one's (they win where both match)."""
        self._rules.extend(other._rules)

    def under(self, prefix: str) -> Ignore:
        """The same rules for a tree moved under ``prefix``: ``under("a").excluded("a/x")``
        is ``excluded("x")``, and nothing outside ``a/`` matches a rule of a subdirectory."""
        moved = Ignore()
        moved._rules = [replace(r, base=posixpath.join(prefix, r.base).rstrip("/"))
                        for r in self._rules]
        return moved

    def matches(self, rel: str, is_dir: bool = False) -> bool:
        """Do the rules exclude ``rel`` itself, parents not considered? For a walker that
        prunes excluded directories before descending (so no parent of ``rel`` is
        excluded); anyone else asks :meth:`excluded`."""
        excluded = False
        for rule in self._rules:
            if rule.dir_only and not is_dir:
                continue
            if rule.base:
                if not rel.startswith(rule.base + "/"):
                    continue
                sub = rel[len(rule.base) + 1:]
            else:
                sub = rel
            if rule.regex.match(sub):
                excluded = not rule.negate
        return excluded

    def excluded(self, rel: str, is_dir: bool = False) -> bool:
        """Is ``rel`` (``a/b/c``) excluded, itself or through a parent directory?"""
        parts = rel.split("/")
        for depth in range(1, len(parts)):
            if self.matches("/".join(parts[:depth]), True):
                return True
        return self.matches(rel, is_dir)
