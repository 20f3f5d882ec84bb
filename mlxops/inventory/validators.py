"""The parsers of inventory variable values: each checks a value and returns it typed.

A parser takes the value as YAML gave it and returns what mlxops uses (an ``int``, a
``dict[str, str]``, ...) or raises :class:`Invalid` whose message follows ``FILE: KEY: ``
(``must be a positive integer, got 'two'``). The loader runs every parser when the
inventory is read, so that a bad value is refused where it is written, before any
connection; ``Host.var`` runs it again to hand out the typed value.

Values that reach SSH (an address, a user, a target) or a node's command line refuse
control characters and whitespace: a newline in ``ansible_user`` would otherwise travel
into an SSH session and fail there, several lines later, as an unreachable host.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Mapping
from typing import Any

from mlxops.node.protocol import BACKENDS
from mlxops.notify import config as notify_config
from mlxops.shell import is_env_name

Parser = Callable[[Any], Any]


class Invalid(ValueError):
    """A value's problem; ``subkey`` names the part of a structured value at fault."""

    def __init__(self, problem: str, subkey: str | None = None) -> None:
        super().__init__(problem)
        self.problem = problem
        self.subkey = subkey


# --- building blocks ----------------------------------------------------------------------


def _is_int(value: Any) -> bool:
    # YAML `true` is a bool, and bool is an int in Python: never accept it as a number.
    return isinstance(value, int) and not isinstance(value, bool)


def _control(text: str) -> str | None:
    """The first control character of ``text`` (as Python writes it), or None."""
    for char in text:
        if ord(char) < 32 or ord(char) == 127:
            return repr(char)
    return None


def _text(value: Any, wanted: str, *, spaces: bool = False) -> str:
    """A non-empty string without control characters (and without whitespace, unless
    ``spaces``); ``wanted`` says what it should be, for the message."""
    if not isinstance(value, str) or not value.strip():
        raise Invalid(f"must be {wanted}, got {value!r}")
    bad = _control(value)
    if bad:
        raise Invalid(f"must be {wanted} without control characters, got {value!r} "
                      f"(holds {bad})")
    if not spaces and any(c.isspace() for c in value):
        raise Invalid(f"must be {wanted} without spaces, got {value!r}")
    return value


def int_range(low: int, high: int, why: str = "") -> Parser:
    """An integer from ``low`` to ``high``; ``why`` explains the upper bound."""
    wanted = "a positive integer" if low == 1 else f"an integer from {low}"
    reason = f" ({why})" if why else ""

    def parse(value: Any) -> int:
        if not (_is_int(value) and value >= low):
            raise Invalid(f"must be {wanted}, got {value!r}")
        if value > high:
            raise Invalid(f"must be at most {high}{reason}, got {value!r}")
        return value

    return parse


# --- scalars ------------------------------------------------------------------------------


def port(value: Any) -> int:
    if not (_is_int(value) and 1 <= value <= 65535):
        raise Invalid(f"must be a port number 1-65535, got {value!r}")
    return value


def zero_or_one(value: Any) -> int:
    if not (_is_int(value) and value in (0, 1)):
        raise Invalid(f"must be 0 or 1, got {value!r}")
    return value


def boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise Invalid(f"must be true or false, got {value!r}")
    return value


def integer(value: Any) -> int:
    if not _is_int(value):
        raise Invalid(f"must be an integer, got {value!r}")
    return value


def choice(*options: str) -> Parser:
    def parse(value: Any) -> str:
        if value not in options:
            wanted = " or ".join(repr(o) for o in options)
            raise Invalid(f"must be {wanted}, got {value!r}")
        return value

    return parse


def backend(value: Any) -> str:
    return choice(*BACKENDS)(value)


_VERSION = re.compile(r"^[0-9]+(\.[0-9]+)*([a-z]+[0-9]*)?(\.(post|dev)[0-9]+)?$")


def version(value: Any) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        # `0.20` unquoted is the float 0.2: say how to write it rather than mangle it.
        raise Invalid(f"must be a version string such as '0.29.1' (quote it), got {value!r}")
    if not (isinstance(value, str) and _VERSION.match(value)):
        raise Invalid(f"must be a version string such as '0.29.1', got {value!r}")
    return value


def boolean_or_version(value: Any) -> bool | str:
    """``true`` / ``false``, or a version string (``mlxops_mlx_lm``: install it, pinned)."""
    if isinstance(value, bool):
        return value
    try:
        return version(value)
    except Invalid:
        raise Invalid(f"must be true, false or a version string such as '0.29.1', "
                      f"got {value!r}") from None


# --- paths and commands -------------------------------------------------------------------


def local_path(value: Any) -> str:
    """A path on the controller (``~`` expands; relative to the inventory file)."""
    return _text(value, "a path", spaces=True)


def node_path(value: Any) -> str:
    """A path on the node: absolute, ``~/...`` (the node user's home) or relative to it."""
    path = _text(value, "a path", spaces=True)
    if path.startswith("~") and path != "~" and not path.startswith("~/"):
        # Only the node user's own home is expanded (as "$HOME"): `~other` would be taken
        # literally, as a directory named '~other'.
        raise Invalid(f"must be an absolute path or start with '~/', got {value!r}")
    return path


def command(value: Any) -> str:
    """A program: a name on the node's PATH or a path, one word."""
    word = _text(value, "a program name or path")
    if word.startswith("-"):
        raise Invalid(f"must be a program name or path, not an option, got {value!r}")
    return word


# --- addresses ----------------------------------------------------------------------------

# RFC 1123 labels; '_' too, as ~/.ssh/config aliases and some LAN names use it.
_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_HOSTNAME = re.compile(rf"^{_LABEL}(?:\.{_LABEL})*\.?$")


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def ip_address(value: Any) -> str:
    """An IPv4 or IPv6 address (the other nodes connect to it)."""
    text = _text(value, "an IP address")
    if not _is_ip(text):
        raise Invalid(f"must be an IP address such as 10.0.0.1, got {value!r}")
    return text


def thunderbolt_ips(value: Any) -> dict[str, str]:
    """``{device: "IPv4/prefix"}``: the data addresses of a Mac's Thunderbolt ports."""
    if not isinstance(value, Mapping) or not value:
        raise Invalid(f"must be a mapping of device: IPv4/prefix (en2: 10.0.0.1/30), "
                      f"got {value!r}")
    for device, cidr in value.items():
        if not isinstance(device, str) or not re.fullmatch(r"en\d+", device):
            raise Invalid(f"must name a device such as en2, got {device!r}", subkey=str(device))
        try:
            iface = ipaddress.IPv4Interface(str(cidr))
        except ValueError:
            iface = None
        if iface is None or "/" not in str(cidr) or iface.ip == iface.network.network_address:
            raise Invalid(f"must be an IPv4 address with its prefix such as 10.0.0.1/30, got "
                          f"{cidr!r}", subkey=device)
    return {str(k): str(c) for k, c in value.items()}


def host_address(value: Any) -> str:
    """A host name (or ``~/.ssh/config`` alias) or an IP address."""
    text = _text(value, "a host name or IP address")
    if _is_ip(text) or (len(text) <= 253 and _HOSTNAME.match(text)):
        return text
    hint = ""
    if "@" in text:
        hint = " (the user goes in ansible_user)"
    elif text.count(":") == 1:
        hint = " (the port goes in ansible_port)"
    raise Invalid(f"must be a host name or IP address, got {value!r}{hint}")


def ssh_user(value: Any) -> str:
    """A login name: one word that ssh cannot read as an option."""
    user = _text(value, "a user name")
    if user.startswith("-"):
        raise Invalid(f"must be a user name, not an option, got {value!r}")
    return user


def ssh_target(value: Any) -> str:
    """``host`` or ``user@host``, as ``ssh`` takes it."""
    text = _text(value, "an SSH target such as 'me@10.0.0.1'")
    user, at, host = text.rpartition("@")
    try:
        if at:
            ssh_user(user)
        host_address(host)
    except Invalid:
        raise Invalid(f"must be an SSH target such as 'me@10.0.0.1' (user@host or host), "
                      f"got {value!r}") from None
    return text


_INTERFACE = re.compile(r"^[A-Za-z0-9_.-]{1,15}$")  # IFNAMSIZ is 16 with the NUL


def interfaces(value: Any) -> str:
    """``en5`` or ``en5,en6`` or a CIDR, as Open MPI's btl_tcp_if_include takes them."""
    text = _text(value, "an interface name such as 'en5' (or a comma list)")
    for item in text.split(","):
        if _INTERFACE.match(item):
            continue
        try:
            ipaddress.ip_network(item, strict=False)
        except ValueError:
            raise Invalid(f"must be interface names such as 'en5' or networks such as "
                          f"10.0.0.0/24, comma separated; {item!r} is neither") from None
    return text


# --- structures ---------------------------------------------------------------------------


def environment(value: Any) -> dict[str, str]:
    """``{NAME: value}``; values become the strings the process sees."""
    if not isinstance(value, Mapping):
        raise Invalid(f"must be a mapping of NAME: value, got {value!r}")
    out = {}
    for name, item in value.items():
        if not (isinstance(name, str) and is_env_name(name)):
            raise Invalid(f"not an environment variable name: {name!r}")
        if isinstance(item, bool) or not isinstance(item, (str, int, float)):
            # YAML `yes` would become "True": make the user say what the process sees.
            raise Invalid(f"must be a string or a number, got {item!r}", subkey=name)
        if isinstance(item, str) and "\0" in item:
            raise Invalid("must not hold a NUL character (no environment can)", subkey=name)
        out[name] = str(item)
    return out


def host_names(value: Any) -> list[str]:
    """A list of distinct host names. Whether each is a host of the inventory is checked
    once the inventory is whole."""
    if not isinstance(value, list) or not value:
        raise Invalid(f"must be a list of host names, got {value!r}")
    seen: set[str] = set()
    for i, name in enumerate(value):
        if not isinstance(name, str) or not name or _control(name) or \
                any(c.isspace() for c in name):
            raise Invalid(f"must be a host name, got {name!r}", subkey=str(i))
        if name in seen:
            raise Invalid(f"{name!r} is listed twice", subkey=str(i))
        seen.add(name)
    return list(value)


def host_name(value: Any) -> str:
    """One host name (whether it is a host of the inventory is checked once it is whole)."""
    if not isinstance(value, str) or not value or _control(value) or \
            any(c.isspace() for c in value):
        raise Invalid(f"must be a host name, got {value!r}")
    return value


_DEVICE = re.compile(r"^[A-Za-z0-9_.-]+$")


def rdma_devices(value: Any) -> dict[str, Any]:
    """``{peer host: device}``; a device may be a list (several Thunderbolt 5 links).

    Whether each peer is a host of the inventory is checked once the inventory is whole.
    """
    if not isinstance(value, Mapping):
        raise Invalid(f"must be a mapping of peer host: RDMA device, got {value!r}")
    for peer, device in value.items():
        if not isinstance(peer, str):
            raise Invalid(f"must name a peer host, got {peer!r}", subkey=str(peer))
        devices = device if isinstance(device, list) and device else [device]
        if not all(isinstance(d, str) and _DEVICE.match(d) for d in devices):
            raise Invalid(f"must be a device name such as 'rdma_en3' (or a list), got {device!r}",
                          subkey=peer)
    return dict(value)


def notify(value: Any) -> Any:
    """A ``notify:`` section (docs/job-file.md, "Notifications"): the jobs' default."""
    try:
        return notify_config.parse_default(value)
    except notify_config.NotifyError as exc:
        raise Invalid(exc.problem, subkey=exc.subkey) from None
