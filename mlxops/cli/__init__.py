"""The ``mlxops`` command line: thin click commands over the library.

Each command group lives in its own module here and exposes one click object named
``command`` (or a list, ``commands``); :data:`COMMANDS` maps every command's name to its
module, and a module is imported only when one of its commands runs (or ``--help`` lists
them: click's documented lazy group), so a command pays only for what it uses. To add a
command: its module here, one line in :data:`COMMANDS`, a section in docs/cli.md.

User errors (:class:`MlxopsError`) become one line on stderr and their exit code
(docs/cli.md, "Exit codes"), never a traceback. Any other exception is a bug: ``mlxops:
internal error: Type: message`` with the hint to rerun with ``MLXOPS_DEBUG=1``, exit 1.
With ``MLXOPS_DEBUG=1`` every error, a user error too, also prints its traceback.
"""

from __future__ import annotations

import importlib
import sys
import traceback
from collections.abc import Iterator, MutableMapping

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

#: Every command's name -> the module under mlxops.cli that defines it (as ``command`` or
#: in ``commands``). Imported only when the command runs: keep one line per command.
COMMANDS: dict[str, str] = {
    "run": "run",
    "trust": "trust",
    "sandbox": "sandbox",
    "hostfile": "hostfile",
    "provision": "provision",
    "launch": "jobs",
    "resume": "jobs",
    "watch": "jobs",
    "status": "jobs",
    "logs": "jobs",
    "stop": "jobs",
    "fetch": "fetch",
    "plan": "plan",
    "check": "check",
    "bench": "bench",
    "monitor": "monitor",
    "dashboard": "monitor",
    "report": "monitor",
    "events": "events",
    "selftest": "selftest",
    "data": "data",
    "serve": "serve",
    "export": "serve",
}


def load_command(name: str) -> click.Command:
    """Command ``name`` (a key of :data:`COMMANDS`), its module imported now."""
    module = importlib.import_module(f"mlxops.cli.{COMMANDS[name]}")
    for command in getattr(module, "commands", None) or [module.command]:
        if command.name == name:
            return command
    raise LookupError(f"mlxops.cli.{COMMANDS[name]} defines no command {name!r}")


class CommandTable(MutableMapping[str, click.Command]):
    """The group's commands by name: every name in :data:`COMMANDS` (listed without
    importing anything), each command's module imported when that command is looked up;
    plus any command added the usual way (``add_command``)."""

    def __init__(self) -> None:
        self._loaded: dict[str, click.Command] = {}

    def __getitem__(self, name: str) -> click.Command:
        if name not in self._loaded:
            if name not in COMMANDS:
                raise KeyError(name)
            self._loaded[name] = load_command(name)
        return self._loaded[name]

    def __setitem__(self, name: str, command: click.Command) -> None:
        self._loaded[name] = command

    def __delitem__(self, name: str) -> None:
        del self._loaded[name]

    def __contains__(self, name: object) -> bool:
        return name in COMMANDS or name in self._loaded

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(set(COMMANDS) | set(self._loaded)))

    def __len__(self) -> int:
        return len(set(COMMANDS) | set(self._loaded))


class _Main(click.Group):
    """The ``mlxops`` group, its commands a :class:`CommandTable`."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.commands = CommandTable()  # type: ignore[assignment]

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


def main() -> None:
    try:
        cli.main(prog_name="mlxops", standalone_mode=True)
    except click.exceptions.UsageError as exc:  # pragma: no cover - click exits itself
        click.echo(str(exc), err=True)
        sys.exit(EXIT_BAD_INPUT)
