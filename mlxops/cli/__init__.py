"""The ``mlxops`` command line: thin click commands over the library.

Each command group lives in its own module here and exposes one click object named
``command``; :data:`COMMAND_MODULES` lists them. User errors (:class:`MlxopsError`)
become one line on stderr and their exit code (docs/cli.md, "Exit codes"), never a
traceback. Any other exception is a bug: ``mlxops: internal error: Type: message`` with
the hint to rerun with ``MLXOPS_DEBUG=1``, exit 1. With ``MLXOPS_DEBUG=1`` every error,
a user error too, also prints its traceback.
"""

from __future__ import annotations

import importlib
import sys
import traceback

import click

from mlxops import __version__
from mlxops.errors import (
    DEBUG_HINT,
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    InternalError,
    MlxopsError,
    debug,
    describe,
)

# One module per command (or command group); each defines ``command`` (or ``commands``).
COMMAND_MODULES = [
    "run",
    "trust",
    "sandbox",
    "hostfile",
    "provision",
    "jobs",
    "fetch",
    "plan",
    "check",
    "bench",
    "monitor",
    "selftest",
]


class _Main(click.Group):
    def invoke(self, ctx: click.Context):  # noqa: D401 - click API
        try:
            return super().invoke(ctx)
        except MlxopsError as exc:
            _traceback(exc)
            click.echo(f"mlxops: error: {exc}", err=True)
            ctx.exit(exc.exit_code)
        except KeyboardInterrupt:
            click.echo("mlxops: interrupted", err=True)
            ctx.exit(130)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise  # click's own: usage errors, --help, ctx.exit
        except Exception as exc:  # noqa: BLE001 - a bug: say so in one line, not a traceback
            # The executor printed each host's traceback already (MLXOPS_DEBUG): here only
            # the controller's side of it, where the operation was started.
            _traceback(exc, chain=not isinstance(exc, InternalError))
            text = str(exc) if isinstance(exc, InternalError) else describe(exc)
            hint = "" if debug() else f" ({DEBUG_HINT})"
            click.echo(f"mlxops: internal error: {text}{hint}", err=True)
            ctx.exit(EXIT_FAILED)


def _traceback(exc: BaseException, chain: bool = True) -> None:
    """With MLXOPS_DEBUG set, the full traceback on stderr (before the one-line message)."""
    if debug():
        sys.stderr.write("".join(traceback.format_exception(exc, chain=chain)))
        sys.stderr.flush()


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
