"""The one registry of inventory variables mlxops reads (DESIGN.md, "Inventory").

Every ``mlxops_*`` variable, and the Ansible connection variables mlxops honours, is
declared here with its default, a validator and a one-line doc, so that the loader can
reject a bad value at the place it is written and the README can list them all.
Variables that are neither ``mlxops_*`` nor registered pass through untouched: users
keep their own Ansible variables in the same file.

A validator takes the value and returns nothing, or raises :class:`Invalid` whose
message follows ``FILE: KEY: `` (e.g. ``must be a positive integer, got 'two'``).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from mlxops.shell import is_env_name

PREFIX = "mlxops_"


class Invalid(ValueError):
    """A value's problem; ``subkey`` names the part of a structured value at fault."""

    def __init__(self, problem: str, subkey: str | None = None) -> None:
        super().__init__(problem)
        self.problem = problem
        self.subkey = subkey


Validator = Callable[[Any], None]


@dataclass(frozen=True)
class Variable:
    name: str
    default: Any
    validator: Validator
    doc: str


VARIABLES: dict[str, Variable] = {}


def register(name: str, default: Any, validator: Validator, doc: str) -> Variable:
    """Declare a variable. Do it in this module, so it is known before any inventory loads."""
    if name in VARIABLES:
        raise ValueError(f"inventory variable {name} registered twice")
    var = Variable(name, default, validator, doc)
    VARIABLES[name] = var
    return var


def default(name: str) -> Any:
    return VARIABLES[name].default


def check(name: str, value: Any) -> None:
    """Raise :class:`Invalid` if ``name`` is an unknown mlxops variable or ``value`` is bad."""
    var = VARIABLES.get(name)
    if var is None:
        if name.startswith(PREFIX):
            raise Invalid(_unknown(name))
        return  # someone else's variable: not ours to judge
    if isinstance(value, str) and "{{" in value:
        # mlxops reads values as written; a template would reach SSH or a node verbatim.
        raise Invalid("Jinja templates are not expanded by mlxops; write the value itself")
    var.validator(value)


def _unknown(name: str) -> str:
    ours = [n for n in VARIABLES if n.startswith(PREFIX)]
    # Compare what follows the shared prefix, or everything would look close.
    close = difflib.get_close_matches(name[len(PREFIX):], [n[len(PREFIX):] for n in ours], n=1)
    if close:
        return f"unknown mlxops variable; did you mean '{PREFIX}{close[0]}'?"
    return f"unknown mlxops variable (known: {', '.join(sorted(ours))})"


# --- validators -------------------------------------------------------------------------


def _is_int(value: Any) -> bool:
    # YAML `true` is a bool, and bool is an int in Python: never accept it as a number.
    return isinstance(value, int) and not isinstance(value, bool)


def positive_int(value: Any) -> None:
    if not (_is_int(value) and value > 0):
        raise Invalid(f"must be a positive integer, got {value!r}")


def port(value: Any) -> None:
    if not (_is_int(value) and 1 <= value <= 65535):
        raise Invalid(f"must be a port number 1-65535, got {value!r}")


def zero_or_one(value: Any) -> None:
    if not (_is_int(value) and value in (0, 1)):
        raise Invalid(f"must be 0 or 1, got {value!r}")


def boolean(value: Any) -> None:
    if not isinstance(value, bool):
        raise Invalid(f"must be true or false, got {value!r}")


def integer(value: Any) -> None:
    if not _is_int(value):
        raise Invalid(f"must be an integer, got {value!r}")


def string(value: Any) -> None:
    if not isinstance(value, str):
        raise Invalid(f"must be a string, got {value!r}")


def word(value: Any) -> None:
    """A non-empty string without whitespace: an address, a user, a path."""
    if not isinstance(value, str) or not value or any(c.isspace() for c in value):
        raise Invalid(f"must be a non-empty string without spaces, got {value!r}")


def path(value: Any) -> None:
    if not isinstance(value, str) or not value.strip():
        raise Invalid(f"must be a path, got {value!r}")


def choice(*options: str) -> Validator:
    def validate(value: Any) -> None:
        if value not in options:
            wanted = " or ".join(repr(o) for o in options)
            raise Invalid(f"must be {wanted}, got {value!r}")

    return validate


_VERSION = re.compile(r"^[0-9]+(\.[0-9]+)*([a-z]+[0-9]*)?(\.(post|dev)[0-9]+)?$")


def version(value: Any) -> None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        # `0.20` unquoted is the float 0.2: say how to write it rather than mangle it.
        raise Invalid(f"must be a version string such as '0.29.1' (quote it), got {value!r}")
    if not (isinstance(value, str) and _VERSION.match(value)):
        raise Invalid(f"must be a version string such as '0.29.1', got {value!r}")


_INTERFACES = re.compile(r"^[A-Za-z0-9_.:/-]+(,[A-Za-z0-9_.:/-]+)*$")


def interfaces(value: Any) -> None:
    """``en5`` or ``en5,en6`` or a CIDR, as Open MPI's btl_tcp_if_include takes them."""
    if not (isinstance(value, str) and _INTERFACES.match(value)):
        raise Invalid(f"must be an interface name such as 'en5' (or a comma list), got {value!r}")


def environment(value: Any) -> None:
    if not isinstance(value, Mapping):
        raise Invalid(f"must be a mapping of NAME: value, got {value!r}")
    for name, item in value.items():
        if not (isinstance(name, str) and is_env_name(name)):
            raise Invalid(f"not an environment variable name: {name!r}")
        if isinstance(item, bool) or not isinstance(item, (str, int, float)):
            # YAML `yes` would become "True": make the user say what the process sees.
            raise Invalid(f"must be a string or a number, got {item!r}", subkey=name)


def rdma_devices(value: Any) -> None:
    """``{peer host: device}``; a device may be a list (several Thunderbolt 5 links)."""
    if not isinstance(value, Mapping):
        raise Invalid(f"must be a mapping of peer host: RDMA device, got {value!r}")
    for peer, device in value.items():
        ok = isinstance(device, str) and device or (
            isinstance(device, list) and device and all(isinstance(d, str) and d for d in device))
        if not ok:
            raise Invalid(f"must be a device name such as 'rdma_en3' (or a list), got {device!r}",
                          subkey=str(peer))


# --- the variables ------------------------------------------------------------------------

# Ansible's connection variables, with Ansible's names and meanings.
register("ansible_host", None, word, "address to connect to (default: the inventory name)")
register("ansible_user", None, string, "SSH user (default: your SSH config / login name)")
register("ansible_port", 22, port, "SSH port")
register("ansible_ssh_private_key_file", None, path,
         "SSH private key; ~ expands, relative paths are relative to the inventory file")
register("ansible_connection", "ssh", choice("ssh", "local"),
         "'ssh', or 'local' to run on this machine without SSH")
register("ansible_become", False, boolean, "run privileged steps with sudo")
register("ansible_group_priority", 1, integer,
         "order of same-depth groups when merging their vars (higher wins)")

# mlxops' own.
register("mlxops_python", "python3", word,
         "interpreter on the node that runs the trainer and node-side helpers")
register("mlxops_root", "~/.mlxops", path, "where mlxops keeps everything on the node")
register("mlxops_slots", 1, positive_int, "processes (ranks) on this host")
register("mlxops_ip", None, word,
         "address other nodes use to reach this one, e.g. a Thunderbolt IP (else ansible_host)")
register("mlxops_env", {}, environment, "extra environment for every rank on this host")
register("mlxops_known_hosts", None, path,
         "known_hosts file to use instead of ~/.ssh/known_hosts (resolved like the key file)")
register("mlxops_mlx_version", None, version, "mlx version to install on the node (pinned)")
register("mlxops_wheelhouse", None, path, "directory of wheels to install from, offline")
register("mlxops_backend", None, choice("ring", "mpi", "jaccl", "jaccl-ring"),
         "backend you run on this host, for provision's checks (a Thunderbolt Bridge "
         "that holds the ports jaccl needs); a job still names its own")
register("mlxops_wired_limit_mb", None, positive_int,
         "iogpu.wired_limit_mb: GPU-wired memory limit in MB (default: wired_share of RAM, 75%)")
register("mlxops_btl_tcp_links", 4, positive_int,
         "OMPI_MCA_btl_tcp_links: TCP connections per peer (mpi backend only)")
register("mlxops_btl_tcp_if_include", None, interfaces,
         "OMPI_MCA_btl_tcp_if_include: interface(s) MPI uses (mpi backend only)")
register("mlxops_metal_fast_synch", 0, zero_or_one,
         "MLX_METAL_FAST_SYNCH: 1 turns it on (MLX warns it can wedge the GPU)")
register("mlxops_rdma", None, rdma_devices,
         "jaccl: RDMA device towards each peer host, e.g. {studio2: rdma_en3}")
register("mlxops_ssh_target", None, word,
         "what mlx.launch/mpirun ssh to for this host (default: user@address)")
