"""The jump host in ``ansible_ssh_common_args`` / ``ansible_ssh_extra_args``: Ansible's way
of naming one (``-J bastion``, ``-o ProxyJump=bastion``, ``-o ProxyCommand="ssh -W %h:%p
bastion"``), which Ansible appends to its ``ssh`` command line.

mlxops connects with paramiko, not ``ssh``, so it reads only what decides the way to the
host: ``ProxyJump`` (``-J``) and ``ProxyCommand``, the first one given (as ssh takes the
first value of an option), common arguments before extra ones. They override
``~/.ssh/config``'s, as ssh's command line does. Other options are Ansible's business (host
keys, for one, follow ``mlxops_known_hosts``).
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from mlxops.inventory.validators import Invalid, port, ssh_target

# ssh(1)'s options that take an argument (its getopt string: "b:c:e:i:l:m:o:p:B:D:E:F:...").
_WITH_ARGUMENT = frozenset("bceilmopBDEFIJLOPQRSwW")
_OPTION_LINE = re.compile(r"\s*(\w+)\s*(?:=|\s)\s*(.*)", re.S)  # "Key=value" or "Key value"


def proxy_options(value: Any) -> dict[str, str]:
    """The jump host a line of ssh arguments names, as ssh_config options:
    ``{"proxyjump": "a,b"}``, ``{"proxycommand": "..."}`` (or ``"none"`` for either:
    none), or ``{}``; :class:`Invalid` when it is not a line of ssh arguments."""
    if not isinstance(value, str):
        raise Invalid(f"must be a string of ssh arguments, got {value!r}")
    try:
        words = shlex.split(value)
    except ValueError as exc:
        raise Invalid(f"must be ssh arguments as a shell would split them: {exc}") from None
    rest = iter(words)
    for word in rest:
        if not word.startswith("-") or word == "-":
            continue
        for i, letter in enumerate(word[1:], start=2):
            if letter not in _WITH_ARGUMENT:
                continue  # a flag (-q, -C, -tt); letters may share one word
            argument = word[i:] or next(rest, None)
            if argument is None:
                raise Invalid(f"ssh option -{letter} needs a value")
            found = _proxy(letter, argument)
            if found:
                return found
            break
    return {}


def _proxy(letter: str, argument: str) -> dict[str, str]:
    if letter == "J":
        return {"proxyjump": _jumps(argument)}
    if letter != "o":
        return {}
    line = _OPTION_LINE.fullmatch(argument)
    if line is None:
        raise Invalid(f"ssh option -o {argument!r}: want Key=value")
    key, setting = line.group(1).lower(), line.group(2).strip()
    if key == "proxyjump":
        return {"proxyjump": _jumps(setting)}
    if key == "proxycommand":
        if not setting:
            raise Invalid("ssh option ProxyCommand needs a command")
        return {"proxycommand": setting}
    return {}


def _jumps(value: str) -> str:
    """``[user@]host[:port]`` hops (``ssh://`` URIs too, ``[v6]:port``), comma separated,
    or ``none``; each one checked as the inventory checks a host."""
    if value.strip().lower() == "none":
        return "none"
    for hop in value.split(","):
        user, at, rest = hop.strip().removeprefix("ssh://").rpartition("@")
        if rest.startswith("["):
            host, _, tail = rest[1:].partition("]")
        else:
            host, colon, number = rest.partition(":")
            tail = colon + number
        try:
            ssh_target(f"{user}{at}{host}")
            if tail:
                if not tail.startswith(":"):
                    raise Invalid(f"unexpected {tail!r} after the host")
                port(int(tail[1:]) if tail[1:].isdigit() else tail[1:])
        except Invalid as exc:
            raise Invalid(f"ProxyJump {hop.strip()!r}: want [user@]host[:port]; "
                          f"{exc.problem}") from None
    return value.strip()
