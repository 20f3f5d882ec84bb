"""docs/ stays the reference of the code as it is: every command and option, every job-file
key, every trainer config key is documented, and every link between the pages resolves."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import click
import pytest

from mlxops.cli import cli
from mlxops.jobs.spec import RESTART_KEYS, TOP_KEYS
from mlxops.trainer.config import SECTIONS

DOCS = Path(__file__).resolve().parents[2] / "docs"


def text(name: str) -> str:
    return (DOCS / name).read_text()


def commands(group: click.Group, prefix: str = ""):
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from commands(command, f"{prefix}{name} ")
        else:
            yield f"{prefix}{name}", command


@pytest.mark.parametrize("name, command", list(commands(cli)), ids=lambda x: str(x))
def test_every_command_and_option_is_in_cli_md(name, command):
    cli_md = text("cli.md")
    words = name.split()
    # `sandbox up` is documented in the `mlxops sandbox up|down|status` section.
    heading = f"## `mlxops {name}" if len(words) == 1 else f"## `mlxops {words[0]} "
    assert heading in cli_md, name
    for param in command.params:
        if isinstance(param, click.Option):
            longest = max(param.opts, key=len)  # --forks, not -f (found anywhere)
            assert re.search(rf"[`\s]{re.escape(longest)}\b", cli_md), (name, longest)


def test_every_job_file_key_is_in_job_file_md():
    doc = text("job-file.md")
    rows = set(re.findall(r"^\| `([a-z_.]+)` \|", doc, re.M))
    assert TOP_KEYS - {"restart"} <= rows, sorted(TOP_KEYS - rows)
    assert {f"restart.{k}" for k in RESTART_KEYS} <= rows


def test_every_trainer_config_key_is_in_trainer_md():
    doc = text("trainer.md")
    rows = set(re.findall(r"^\| `([a-z_.]+)` \|", doc, re.M))
    keys = {f"{section}.{f.name}" for section, cls in SECTIONS.items()
            for f in dataclasses.fields(cls)} | {"out"}
    assert keys <= rows, sorted(keys - rows)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_links_between_pages_resolve():
    pages = sorted(DOCS.glob("*.md"))
    assert {p.name for p in pages} >= {"README.md", "cli.md", "inventory.md", "job-file.md",
                                        "trainer.md", "formats.md"}
    anchors = {p.name: {slug(h) for h in re.findall(r"^#+ (.+)$", p.read_text(), re.M)}
               for p in pages}
    links = 0
    for page in pages:
        for target, anchor in re.findall(r"\]\(([\w.-]*\.md|)(?:#([\w-]+))?\)",
                                         page.read_text()):
            target = target or page.name
            links += 1
            assert target in anchors, f"{page.name}: link to missing {target}"
            if anchor:
                assert anchor in anchors[target], f"{page.name}: no #{anchor} in {target}"
    assert links > 20


def test_the_module_map_names_every_part_of_the_package():
    # the map moved from the README to docs/architecture.md (issue 27)
    layout = text("architecture.md").split("## The modules", 1)[1].split("```")[1]
    named = {line.split()[0].rstrip("/") for line in layout.splitlines()
             if line.startswith("  ") and not line.startswith("   ")}
    parts = {p.name for p in (DOCS.parent / "mlxops").iterdir()
             if not p.name.startswith("_") and (p.is_dir() or p.suffix == ".py")}
    assert parts - named == set()
