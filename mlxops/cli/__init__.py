"""The ``mlxops`` command line: thin click commands over the library.

Each command group lives in its own module here and exposes one click object named
``command`` (or a list, ``commands``); :data:`COMMANDS` maps every command's name to its
module, and a module is imported only when one of its commands runs (click's documented
lazy group), so a command pays only for what it uses. ``mlxops --help`` imports none:
it lists each command with its one-line summary from :data:`COMMANDS` (a unit test holds
each equal to the command's own first sentence). To add a command: its module here, one
line in :data:`COMMANDS` (module and summary), a section in docs/cli.md.

User errors (:class:`MlxopsError`) become one line on stderr and their exit code
(docs/cli.md, "Exit codes"), never a traceback. Any other exception is a bug: ``mlxops:
internal error: Type: message`` with the hint to rerun with ``MLXOPS_DEBUG=1``, exit 1.
With ``MLXOPS_DEBUG=1`` every error, a user error too, also prints its traceback.
"""

from __future__ import annotations

import importlib
import sys
import textwrap
import traceback
from collections.abc import Iterator, MutableMapping
from typing import NamedTuple

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


class Entry(NamedTuple):
    """A command's line in :data:`COMMANDS`."""

    module: str   # under mlxops.cli: defines it (as ``command`` or in ``commands``)
    summary: str  # its line in ``mlxops --help``: the first sentence of its own help


#: Every command: its module, imported only when the command runs, and its one-line
#: summary, which ``mlxops --help`` lists without importing the module (as click would
#: take it from the command: tests/unit/cli/test_cli_summaries.py holds them equal). One line
#: per command.
COMMANDS: dict[str, Entry] = {
    "run": Entry("run", ("Run COMMAND on every selected host, in parallel, and show each host's "
                         "output.")),
    "trust": Entry("trust", ("Show each host's SSH host-key fingerprint, and its jump hosts', and "
                             "record the new ones in known_hosts.")),
    "init": Entry("init", ("Find Macs (mDNS) or take HOSTs, trust their keys, read them, and "
                           "write an inventory and a starter job.")),
    "sandbox": Entry("sandbox", ("Fake Mac nodes on Linux (network namespaces + sshd); needs "
                                 "root.")),
    "hostfile": Entry("hostfile", ("Render the hostfile of the selected hosts for BACKEND (one "
                                   "entry per rank).")),
    "provision": Entry("provision", ("Make every selected Mac ready to train: facts, env, "
                                     "Python+MLX, hostfiles, code.")),
    "launch": Entry("jobs", ("Start JOB on its hosts and follow it (Ctrl-C detaches, never "
                             "kills).")),
    "resume": Entry("jobs", "Relaunch job NAME from the newest checkpoint that every node has."),
    "watch": Entry("jobs", "Follow job NAME and supervise it: restart on a dead or stalled rank."),
    "status": Entry("jobs", ("Where job NAME is: per rank host, pid, state, step, loss, tokens/s, "
                             "heartbeat.")),
    "logs": Entry("jobs", "The ranks' output, merged, each line prefixed with host and rank."),
    "stop": Entry("jobs", ("Stop every rank of job NAME and verify nothing of it runs (safe to "
                           "repeat).")),
    "fetch": Entry("fetch", ("Bring fine-tuning job NAME's adapters (or full weights) to this "
                             "machine, in mlx-lm's layout: mlx_lm.generate --adapter-path DIR "
                             "takes them as they are.")),
    "plan": Entry("plan", ("Per node: parameters, gradients, optimizer state and activations of "
                           "one rank, and the micro-batch, accumulation and checkpointing that "
                           "fit its memory.")),
    "check": Entry("check", ("Check that every selected host is ready to train, and print a host "
                             "x check table.")),
    "bench": Entry("bench", ("Measure every link (latency, bandwidth), a real all-reduce, and "
                             "find the ring order whose slowest link is fastest.")),
    "monitor": Entry("monitor", ("Live terminal view of job NAME: per rank state, step, loss, "
                                 "tokens/s, memory, heartbeat; cluster totals, restarts and "
                                 "alerts.")),
    "dashboard": Entry("monitor", ("Serve a local web page of every job: state, loss and tokens/s "
                                   "curves updating live, compute/all-reduce split, memory, "
                                   "restarts, per-node health, the last bench.")),
    "report": Entry("monitor", ("One self-contained HTML file of job NAME (opens offline): loss "
                                "and tokens/s curves, tokens/s per rank, restarts, config, plan "
                                "and bench figures.")),
    "events": Entry("events", ("The timeline of job NAME: launch, each restart and its reason, "
                               "stops, resumes, alerts and the notifications sent, oldest "
                               "first.")),
    "selftest": Entry("selftest", ("Run on your own nodes what mlxops' tests run: trust status, "
                                   "provision, check, a short bench, a job with one rank killed "
                                   "(kill -9) and recovered by the watchdog, stop.")),
    "data": Entry("data", "Corpora for the bundled trainer: token shards and their manifest."),
    "serve": Entry("serve", ("Forward a local port to serve job NAME's server and print its base "
                             "URL.")),
    "export": Entry("serve", ("Write job RUN's bundled-trainer checkpoint in mlx-lm's layout "
                              "(config.json, safetensors, a byte-level tokenizer.json): "
                              "mlx_lm.load, generate and server read it.")),
}


def short_help(summary: str, limit: int) -> str:
    """``summary`` cut to ``limit`` characters as click cuts a command's short help in a
    group's ``--help`` (at a word, ending ``...``)."""
    if len(summary) <= limit:
        return summary
    return textwrap.shorten(summary, limit, placeholder="...", break_on_hyphens=False)


def load_command(name: str) -> click.Command:
    """Command ``name`` (a key of :data:`COMMANDS`), its module imported now."""
    module = importlib.import_module(f"mlxops.cli.{COMMANDS[name].module}")
    for command in getattr(module, "commands", None) or [module.command]:
        if command.name == name:
            return command
    raise LookupError(f"mlxops.cli.{COMMANDS[name].module} defines no command {name!r}")


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

    def summary(self, name: str, limit: int) -> str | None:
        """Command ``name``'s line in the group's ``--help``, cut to ``limit``; None for a
        hidden command. From :data:`COMMANDS` while its module is not imported."""
        if name in self._loaded:
            command = self._loaded[name]
            return None if command.hidden else command.get_short_help_str(limit)
        return short_help(COMMANDS[name].summary, limit)


class _Main(click.Group):
    """The ``mlxops`` group, its commands a :class:`CommandTable`."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.commands = CommandTable()  # type: ignore[assignment]

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """click's own commands section (``Group.format_commands``), each line from the
        table's summary instead of the loaded command."""
        names = self.list_commands(ctx)
        if not names:
            return
        limit = formatter.width - 6 - max(len(name) for name in names)
        rows = [(name, line) for name in names
                if (line := self.commands.summary(name, limit)) is not None]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

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
