"""``mlxops --help`` lists the commands from the table's summaries (mlxops.cli.COMMANDS),
importing no command module: each summary must stay what click would take from the
command itself, and the listing must read exactly as click's own."""

from __future__ import annotations

import click
import pytest

import mlxops.cli
from mlxops.cli import COMMANDS, CommandTable, cli


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_summary_is_the_commands_own_first_sentence(name):
    command = cli.commands[name]
    assert not command.hidden
    assert COMMANDS[name].summary == command.get_short_help_str(limit=10_000)


def commands_section(group: click.Group, format_commands, width: int) -> str:
    ctx = click.Context(group, info_name="mlxops", terminal_width=width, max_content_width=width)
    formatter = ctx.make_formatter()
    format_commands(ctx, formatter)
    return formatter.getvalue()


def refuse_to_load(name: str) -> click.Command:
    raise AssertionError(f"--help imported the module of {name!r}")


@pytest.mark.parametrize("width", [50, 80, 132])
def test_the_listing_reads_as_clicks_own_and_loads_no_command(monkeypatch, width):
    eager = commands_section(cli, lambda ctx, f: click.Group.format_commands(cli, ctx, f),
                             width)
    monkeypatch.setattr(cli, "commands", CommandTable())
    monkeypatch.setattr(mlxops.cli, "load_command", refuse_to_load)
    lazy = commands_section(cli, cli.format_commands, width)
    assert "Commands:" in lazy and "  bench " in lazy
    assert lazy == eager


def test_a_command_added_by_hand_is_listed_from_itself_unless_hidden(monkeypatch):
    monkeypatch.setattr(cli, "commands", CommandTable())
    monkeypatch.setattr(mlxops.cli, "load_command", refuse_to_load)
    cli.add_command(click.Command("zz-extra", help="An extra command. Not in the table."))
    cli.add_command(click.Command("zz-hidden", help="Hidden.", hidden=True))
    lazy = commands_section(cli, cli.format_commands, 80)
    assert "  zz-extra   An extra command.\n" in lazy
    assert "zz-hidden" not in lazy
