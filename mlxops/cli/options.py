"""Options shared by the commands that reach hosts, and the small helpers they share."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import click

F = Callable[..., Any]


def inventory_argument(f: F) -> F:
    return click.argument("inventory", type=click.Path(dir_okay=False))(f)


def limit_option(f: F) -> F:
    return click.option("--limit", "-l", metavar="PATTERN",
                        help="Hosts or groups, Ansible style: 'macs', 'a,b', 'mac*', '!mac3', "
                             "'macs:&studios'.")(f)


def forks_option(f: F) -> F:
    return click.option("--forks", "-f", type=click.IntRange(1, 256), default=None,
                        help="Hosts worked on at once (default: min(32, hosts)).")(f)


def json_option(f: F) -> F:
    return click.option("--json", "as_json", is_flag=True,
                        help="Print one JSON document on stdout and nothing else there.")(f)


def _accept_new_host_keys(f: F) -> F:
    return click.option("--accept-new-host-keys", is_flag=True,
                        help="Record unknown host keys (like ssh's accept-new); a changed key "
                             "is still refused.")(f)


def _connect_timeout(f: F) -> F:
    return click.option("--connect-timeout", type=click.FloatRange(0.1, 600), default=10.0,
                        show_default=True, help="Seconds to wait for each SSH connection.")(f)


def connect_options(f: F) -> F:
    """``--accept-new-host-keys`` and ``--connect-timeout``, given to the command as one
    keyword, ``connect`` (a :class:`~mlxops.transport.ConnectOptions`)."""
    @functools.wraps(f)
    def command(*args: Any, accept_new_host_keys: bool, connect_timeout: float,
                **kwargs: Any) -> Any:
        from mlxops.transport import ConnectOptions  # when the command runs, not at --help

        return f(*args, connect=ConnectOptions(accept_new_host_keys=accept_new_host_keys,
                                               connect_timeout=connect_timeout), **kwargs)

    return _connect_timeout(_accept_new_host_keys(command))


def connect_timeout_option(f: F) -> F:
    """``--connect-timeout`` alone, as ``connect``: for ``mlxops trust``, which records
    host keys only after showing them (it never takes ``--accept-new-host-keys``)."""
    @functools.wraps(f)
    def command(*args: Any, connect_timeout: float, **kwargs: Any) -> Any:
        from mlxops.transport import ConnectOptions

        return f(*args, connect=ConnectOptions(connect_timeout=connect_timeout), **kwargs)

    return _connect_timeout(command)
