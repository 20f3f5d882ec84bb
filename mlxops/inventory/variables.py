"""The one registry of inventory variables mlxops reads (README, "Inventory").

Every ``mlxops_*`` variable, and the Ansible connection variables mlxops honours, is
declared here with its default, a parser (:mod:`mlxops.inventory.validators`) and a
one-line doc. The loader runs the parser on every value where it is written, so a bad
value is refused before any connection; :func:`value` (``Host.var``) hands out the parsed
value or the default, so no caller restates a default or a conversion. Variables that are
neither ``mlxops_*`` nor registered pass through untouched: users keep their own Ansible
variables in the same file.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mlxops.inventory import sshargs
from mlxops.inventory import validators as v
from mlxops.inventory.validators import Invalid, Parser

PREFIX = "mlxops_"

#: The most ranks one host may run. The largest Mac (M3 Ultra) has 32 CPU cores and one
#: GPU that every rank shares; a data-parallel rank per core is already past any speed-up,
#: so a bigger number is a typo (e.g. a port or a memory size in the wrong field).
MAX_SLOTS = 32
#: The most RAM any Mac offers is 512 GB (M3 Ultra): a wired limit above it is a typo.
MAX_WIRED_LIMIT_MB = 512 * 1024
#: Open MPI opens this many TCP connections to every peer; past 64 they only use up ports.
MAX_BTL_TCP_LINKS = 64


@dataclass(frozen=True)
class Variable:
    name: str
    default: Any
    parse: Parser
    doc: str


VARIABLES: dict[str, Variable] = {}


def register(name: str, default: Any, parse: Parser, doc: str) -> Variable:
    """Declare a variable. Do it in this module, so it is known before any inventory loads."""
    if name in VARIABLES:
        raise ValueError(f"inventory variable {name} registered twice")
    var = Variable(name, default, parse, doc)
    VARIABLES[name] = var
    return var


def default(name: str) -> Any:
    return VARIABLES[name].default


def value(name: str, raw: Any) -> Any:
    """``raw`` (a host's value, None when unset) parsed, or the registered default."""
    var = VARIABLES[name]
    return var.default if raw is None else var.parse(raw)


def check(name: str, raw: Any) -> None:
    """Raise :class:`Invalid` if ``name`` is an unknown mlxops variable or ``raw`` is bad."""
    var = VARIABLES.get(name)
    if var is None:
        if name.startswith(PREFIX):
            raise Invalid(_unknown(name))
        return  # someone else's variable: not ours to judge
    if isinstance(raw, str) and "{{" in raw:
        # mlxops reads values as written; a template would reach SSH or a node verbatim.
        raise Invalid("Jinja templates are not expanded by mlxops; write the value itself")
    var.parse(raw)


def ring_order_line(order: list[str]) -> str:
    """The inventory line (under ``all: vars``) that makes ``order`` the hosts' order, so
    the rank order everywhere: what ``mlxops bench`` and ``mlxops check`` tell users."""
    return f"mlxops_ring_order: [{', '.join(order)}]"


def ring_ordered(names: Sequence[str], order: Sequence[str]) -> list[str]:
    """The one rule of a ring order, whether ``mlxops_ring_order`` or a bench result's
    (``mlxops hostfile --order``, ``mlxops bench --apply``) gives it: the ``names`` the
    ``order`` lists first, in its order, then the others in their own order. Names of the
    order that are not among ``names`` (hosts not selected) are left out; whether each is
    a host at all is the caller's to check, where it can name the key."""
    listed = [n for n in dict.fromkeys(order) if n in names]
    return listed + [n for n in names if n not in listed]


def _unknown(name: str) -> str:
    ours = [n for n in VARIABLES if n.startswith(PREFIX)]
    # Compare what follows the shared prefix, or everything would look close.
    close = difflib.get_close_matches(name[len(PREFIX):], [n[len(PREFIX):] for n in ours], n=1)
    if close:
        return f"unknown mlxops variable; did you mean '{PREFIX}{close[0]}'?"
    return f"unknown mlxops variable (known: {', '.join(sorted(ours))})"


# --- the variables ------------------------------------------------------------------------

# Ansible's connection variables, with Ansible's names and meanings.
register("ansible_host", None, v.host_address,
         "address to connect to: a host name or IP address (default: the inventory name)")
register("ansible_user", None, v.ssh_user, "SSH user (default: your SSH config / login name)")
register("ansible_port", 22, v.port, "SSH port")
register("ansible_ssh_private_key_file", None, v.local_path,
         "SSH private key; ~ expands, relative paths are relative to the inventory file")
register("ansible_connection", "ssh", v.choice("ssh", "local"),
         "'ssh', or 'local' to run on this machine without SSH")
register("ansible_become", False, v.boolean, "run privileged steps with sudo")
register("ansible_ssh_common_args", None, sshargs.proxy_options,
         "ssh arguments; mlxops reads its jump host: -J, -o ProxyJump=, -o ProxyCommand=")
register("ansible_ssh_extra_args", None, sshargs.proxy_options,
         "more ssh arguments, read as ansible_ssh_common_args (after it)")
register("ansible_group_priority", 1, v.integer,
         "order of same-depth groups when merging their vars (higher wins)")

# mlxops' own.
register("mlxops_python", "python3", v.command,
         "interpreter on the node that runs the trainer and node-side helpers")
register("mlxops_root", "~/.mlxops", v.node_path, "where mlxops keeps everything on the node")
register("mlxops_slots", 1,
         v.int_range(1, MAX_SLOTS, "the largest Mac has 32 CPU cores and one GPU"),
         "processes (ranks) on this host")
register("mlxops_ip", None, v.ip_address,
         "IP address other nodes use to reach this one, e.g. a Thunderbolt IP "
         "(else ansible_host)")
register("mlxops_env", {}, v.environment, "extra environment for every rank on this host")
register("mlxops_known_hosts", None, v.local_path,
         "known_hosts file to use instead of ~/.ssh/known_hosts (resolved like the key file)")
register("mlxops_mlx_version", None, v.version, "mlx version to install on the node (pinned)")
register("mlxops_mlx_lm", False, v.boolean_or_version,
         "install mlx-lm on the node (fine-tuning): true pins the controller's version, "
         "or give the version")
register("mlxops_wheelhouse", None, v.local_path, "directory of wheels to install from, offline")
register("mlxops_backend", None, v.backend,
         "backend you run on this host, for provision's checks (a Thunderbolt Bridge "
         "that holds the ports jaccl needs); a job still names its own")
register("mlxops_wired_limit_mb", None,
         v.int_range(1, MAX_WIRED_LIMIT_MB, "no Mac has more than 512 GB of memory"),
         "iogpu.wired_limit_mb: GPU-wired memory limit in MB (default: wired_share of RAM, 75%)")
register("mlxops_thunderbolt_ips", None, v.thunderbolt_ips,
         "opt-in: {device: IP/prefix} the thunderbolt_ips task sets with networksetup")
register("mlxops_btl_tcp_links", 4,
         v.int_range(1, MAX_BTL_TCP_LINKS, "more TCP connections per peer only use up ports"),
         "OMPI_MCA_btl_tcp_links: TCP connections per peer (mpi backend only)")
register("mlxops_btl_tcp_if_include", None, v.interfaces,
         "OMPI_MCA_btl_tcp_if_include: interface(s) MPI uses (mpi backend only)")
register("mlxops_metal_fast_synch", 0, v.zero_or_one,
         "MLX_METAL_FAST_SYNCH: 1 turns it on (MLX warns it can wedge the GPU)")
register("mlxops_rdma", None, v.rdma_devices,
         "jaccl: RDMA device towards each peer host, e.g. {studio2: rdma_en3}")
register("mlxops_notify", None, v.notify,
         "(under all: vars) the jobs' default notify: section (command:, webhook:, "
         "events:, ...); a job's own notify: is read over it key by key")
register("mlxops_ring_order", None, v.host_names,
         "(under all: vars) the hosts' order around the ring, so the order of ranks, "
         "hostfiles and rank ports: those listed first, in this order, then the others "
         "in file order (e.g. the ring mlxops bench found)")
register("mlxops_supervisor", None, v.host_name,
         "(under all: vars) the host whose watchdog supervises every job (an always-on "
         "Mac of the inventory; 'controller': this machine, the default); a job's own "
         "supervisor: wins")
register("mlxops_ssh_target", None, v.ssh_target,
         "what mlx.launch/mpirun ssh to for this host (default: user@address)")
