"""The ``mlxops`` command line: thin click commands over the library.

Each command group lives in its own module here and exposes one click object named
``command``; :data:`COMMAND_MODULES` lists them. User errors (:class:`MlxopsError`)
become one line on stderr and the exit code of DESIGN.md, never a traceback.
"""

from __future__ import annotations

import importlib
import sys

import click

from mlxops import __version__
from mlxops.errors import EXIT_BAD_INPUT, MlxopsError

# One module per command (or command group); each defines ``command`` (or ``commands``).
COMMAND_MODULES = [
    "run",
    "trust",
    "sandbox",
    "hostfile",
    "provision",
    "jobs",
    "plan",
]


class _Main(click.Group):
    def invoke(self, ctx: click.Context):  # noqa: D401 - click API
        try:
            return super().invoke(ctx)
        except MlxopsError as exc:
            click.echo(f"mlxops: error: {exc}", err=True)
            ctx.exit(exc.exit_code)
        except KeyboardInterrupt:
            click.echo("mlxops: interrupted", err=True)
            ctx.exit(130)


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="mlxops")
def cli() -> None:
    """Provision Apple Silicon Macs over SSH and run MLX training on them as one job."""


def _register() -> None:
    for name in COMMAND_MODULES:
        module = importlib.import_module(f"mlxops.cli.{name}")
        for command in getattr(module, "commands", None) or [module.command]:
            cli.add_command(command)


_register()


def main() -> None:
    try:
        cli.main(prog_name="mlxops", standalone_mode=True)
    except click.exceptions.UsageError as exc:  # pragma: no cover - click exits itself
        click.echo(str(exc), err=True)
        sys.exit(EXIT_BAD_INPUT)
