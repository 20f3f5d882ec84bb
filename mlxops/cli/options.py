"""Options shared by the commands that reach hosts, and the small helpers they share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from mlxops.transport import ConnectOptions, Connector

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


def host_key_options(f: F) -> F:
    f = click.option("--accept-new-host-keys", is_flag=True,
                     help="Record unknown host keys (like ssh's accept-new); a changed key is "
                          "still refused.")(f)
    f = click.option("--connect-timeout", type=click.FloatRange(0.1, 600), default=10.0,
                     show_default=True, help="Seconds to wait for each SSH connection.")(f)
    return f


def connector_from(accept_new_host_keys: bool, connect_timeout: float) -> Connector:
    return Connector(ConnectOptions(accept_new_host_keys=accept_new_host_keys,
                                    connect_timeout=connect_timeout))
