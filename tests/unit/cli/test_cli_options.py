"""The host-key options every command that reaches hosts shares: one set of flags, given to
the command as one ``ConnectOptions``."""

from __future__ import annotations

import inspect

import click
from click.testing import CliRunner

from mlxops.cli import cli
from mlxops.cli.options import connect_options, connect_timeout_option, json_option
from mlxops.transport import ConnectOptions


def _commands(group: click.Group = cli, prefix: str = "") -> dict[str, click.Command]:
    found: dict[str, click.Command] = {}
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            found.update(_commands(command, f"{prefix}{name} "))
        else:
            found[prefix + name] = command
    return found


def _seen(decorate) -> tuple[click.Command, list]:
    seen = []

    @click.command()
    @json_option
    @decorate
    def command(as_json, connect):
        seen.append((as_json, connect))

    return command, seen


def test_the_flags_reach_the_command_as_one_connect_options():
    command, seen = _seen(connect_options)
    runner = CliRunner()
    assert runner.invoke(command, ["--connect-timeout", "3", "--accept-new-host-keys",
                                   "--json"]).exit_code == 0
    assert runner.invoke(command, []).exit_code == 0
    assert seen == [(True, ConnectOptions(accept_new_host_keys=True, connect_timeout=3.0)),
                    (False, ConnectOptions(accept_new_host_keys=False, connect_timeout=10.0))]


def test_trust_takes_the_timeout_but_never_accepts_new_keys_unseen():
    command, seen = _seen(connect_timeout_option)
    runner = CliRunner()
    assert runner.invoke(command, ["--connect-timeout", "2"]).exit_code == 0
    assert seen == [(False, ConnectOptions(connect_timeout=2.0))]
    assert runner.invoke(command, ["--accept-new-host-keys"]).exit_code == 2
    assert "--accept-new-host-keys" not in {o for p in cli.commands["trust"].params
                                            for o in p.opts}


def test_every_command_that_connects_takes_the_shared_set_as_one_parameter():
    connecting = {name: command for name, command in _commands().items()
                  if any("--connect-timeout" in p.opts for p in command.params)}
    assert {"launch", "check", "provision", "run", "bench", "trust", "selftest"} <= set(connecting)
    for name, command in connecting.items():
        flags = {o for p in command.params for o in p.opts}
        if name != "trust":
            assert "--accept-new-host-keys" in flags, name
        # The function behind the click command: the wrapper's inner one.
        parameters = inspect.signature(inspect.unwrap(command.callback)).parameters
        assert "connect" in parameters, name
        assert not {"connect_timeout", "accept_new_host_keys"} & set(parameters), name
