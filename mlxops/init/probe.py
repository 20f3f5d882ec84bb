"""What init reads from one host after its key is trusted: one command.

The facts command (:func:`mlxops.tasks.facts.gather`: chip, memory, macOS build, the
interpreter, and on a Mac its hardware ports: ``networksetup -listallhardwareports``, the
map ``mlx.distributed_config`` reads to find the Thunderbolt ports, parsed once by
:func:`mlxops.macnet.parse_hardware_ports` into ``facts.macos.hardware_ports``) with reads
of init's own riding along, so a host costs one round trip:

- ``addrs``: every IPv4 address with its netmask (``ifconfig`` on a Mac, ``ip -o -4 addr``
  elsewhere) -- the facts keep addresses without masks;
- ``python``: the first of the candidate interpreters that imports ``mlx.core``;
- ``reach``: which of the given addresses (the other hosts' SSH addresses) this host
  connects to, in the facts' own interpreter (:data:`_REACH`); peers' other addresses
  (a Thunderbolt one) are tried afterwards by :func:`reaches`, only where needed;
- ``sudo``: on a Mac, whether ``sudo -n true`` works: provision needs root to set the GPU
  wired limit and sleep (``ansible_become``), and ``check`` checks them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mlxops import shell
from mlxops.hostfacts import HostFacts
from mlxops.init.links import NodeLinks, parse_ifconfig_addresses, parse_ip_addr
from mlxops.tasks.base import PythonRead
from mlxops.tasks.facts import gather

#: Where a Mac keeps a Python that may have mlx, tried after the ones given (Homebrew on
#: Apple silicon, then Intel's prefix, then the Command Line Tools' python3).
CANDIDATES = ("python3", "/opt/homebrew/bin/python3", "/usr/local/bin/python3",
              "/usr/bin/python3")

_ADDRS = ('if [ "$(uname -s)" = Darwin ]; then ifconfig; '
          "else ip -o -4 addr show || /sbin/ip -o -4 addr show; fi")


def _python_read(candidates: Sequence[str]) -> str:
    words = " ".join(shell.quote(c) for c in candidates)
    return (f"for p in {words}; do q=$(command -v \"$p\" 2>/dev/null) || continue; "
            "v=$(\"$q\" -c 'import mlx.core as m; print(m.__version__)' 2>/dev/null) && "
            "{ printf '%s\\n%s\\n' \"$q\" \"$v\"; break; }; "
            "done; true")


@dataclass
class Probed:
    """One host as init found it."""

    facts: HostFacts
    links: NodeLinks
    python: str | None   # an interpreter that imports mlx.core, absolute; None: none
    mlx: str | None = None  # the mlx it imports
    sudo: bool = False      # a Mac where ``sudo -n`` works (no password asked)
    tried: frozenset[str] = frozenset()    # addresses the probe tried to reach
    reached: frozenset[str] = frozenset()  # ... and those that answered


def probe(conn, host, pythons: Sequence[str] = (), peers: Sequence[str] = ()) -> Probed:
    """Read ``host`` over ``conn`` (a trusted connection), trying ``peers`` (addresses);
    raises RuntimeError when the facts command does not answer."""
    reads: dict[str, str | PythonRead] = {
        "init.addrs": _ADDRS,
        "init.python": _python_read([*pythons, *CANDIDATES]),
        "init.sudo": 'if [ "$(uname -s)" = Darwin ]; then sudo -n true; else false; fi'}
    if peers:
        reads["init.reach"] = PythonRead(_REACH, tuple(peers))
    facts, answers = gather(conn, host, reads)
    addrs = answers.get("init.addrs")
    text = addrs.stdout if addrs else ""
    parsed = parse_ifconfig_addresses(text) if facts.is_darwin else parse_ip_addr(text)
    found = answers.get("init.python")
    lines = found.stdout.split() if found else []
    reach = answers.get("init.reach")
    tried = frozenset(peers) if reach is not None and reach.exit_code == 0 else frozenset()
    ports = dict(facts.macos.hardware_ports) if facts.macos else {}
    return Probed(facts, NodeLinks(ports, parsed),
                  lines[0] if lines else None, lines[1] if len(lines) > 1 else None,
                  getattr(answers.get("init.sudo"), "exit_code", 1) == 0,
                  tried, tried & frozenset(reach.stdout.split()) if tried else frozenset())


# Runs under the node's interpreter with mlx (found by the probe): a TCP connection to
# port 22 of every address given, at once, one second each; prints those that connected.
_REACH = (
    "import socket, sys, concurrent.futures as f\n"
    "def t(a):\n"
    "    try:\n"
    "        socket.create_connection((a, 22), 1).close(); return a\n"
    "    except OSError:\n"
    "        return None\n"
    "with f.ThreadPoolExecutor(16) as p:\n"
    "    print('\\n'.join(a for a in p.map(t, sys.argv[1:]) if a))\n"
)


def reaches(conn, python: str, addresses: Sequence[str]) -> set[str]:
    """Which of ``addresses`` the node connects to (sshd's port: every peer has one open),
    as ``mlx.distributed_config`` checks that a peer answers on an address before using
    it. Raises RuntimeError when the command fails."""
    if not addresses:
        return set()
    result = conn.run(shell.join([python, "-c", _REACH, *addresses]), timeout=30)
    if result.exit_code != 0:
        raise RuntimeError(f"trying the peers' addresses failed: {result.error_line()}")
    return set(result.stdout.split()) & set(addresses)
