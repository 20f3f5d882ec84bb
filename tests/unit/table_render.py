"""Rendering a table as the CLI renders it, into a console of a given width, and the rule
that it stays readable there; shared by tests/unit/cli/test_tables.py and
tests/unit/bench/test_bench_results.py (imported by bare name: tests/unit/conftest.py)."""

from __future__ import annotations

import io
import re

from rich.console import Console

from mlxops import console


def render(renderable, width: int = 80, terminal: bool = True) -> str:
    buf = io.StringIO()
    con = Console(file=buf, width=width, force_terminal=terminal, color_system=None,
                  highlight=False, soft_wrap=True)
    if isinstance(renderable, list):
        for line in renderable:
            con.print(line)
    else:
        console.print_table(renderable, con)
    return buf.getvalue()


def assert_readable(text: str, headers: list[str], width: int = 80) -> None:
    assert "…" not in text, text
    lines = text.splitlines()
    assert all(len(line.rstrip()) <= width for line in lines), text
    if headers:
        # The header is one line holding every header whole (none split mid-word).
        header = next(line for line in lines if line.strip().startswith(headers[0]))
        for h in headers:
            assert re.search(rf"(^|\s){re.escape(h)}(\s|$)", header), (h, text)
