"""What init reads from one host after its key is trusted: one command.

The facts command (:func:`mlxops.tasks.facts.gather`: chip, memory, macOS build, the
interpreter, and on a Mac its hardware ports: ``networksetup -listallhardwareports``, the
map ``mlx.distributed_config`` reads to find the Thunderbolt ports, parsed once by
:func:`mlxops.macnet.parse_hardware_ports` into ``facts.macos.hardware_ports``) with reads
of init's own riding along, so a host costs one round trip:

- the addresses: every IPv4 address with its netmask, parsed from the facts command's
  own ``ifconfig`` (a Mac) or ``ip -o -4 addr`` (Linux) section -- the facts record keeps
  addresses without masks, so the section is read here rather than run a second time;
- ``python``: the first of the candidate interpreters that imports ``mlx.core``. The facts
  run in the first candidate (the host's own ``mlxops_python`` where the inventory sets
  one, then the ``--python`` ones, then :data:`CANDIDATES`), which imports ``mlx.core``
  anyway: when it succeeds that is the answer, with no Python started for it; only when
  it fails does the read (:data:`_FIND`, in the same interpreter) try the others, each in
  its own process. A first candidate that does not exist on the node runs no Python at
  all: the other candidates are then tried by a second command (:data:`_python_read`);
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
from mlxops.tasks.base import PythonRead, read_answers
from mlxops.tasks.facts import build_facts, facts_script, split_sections

#: Where a Mac keeps a Python that may have mlx, tried after the ones given (Homebrew on
#: Apple silicon, then Intel's prefix, then the Command Line Tools' python3).
CANDIDATES = ("python3", "/opt/homebrew/bin/python3", "/usr/local/bin/python3",
              "/usr/bin/python3")



def _python_read(candidates: Sequence[str]) -> str:
    words = " ".join(shell.quote(c) for c in candidates)
    return (f"for p in {words}; do q=$(command -v \"$p\" 2>/dev/null) || continue; "
            "v=$(\"$q\" -c 'import mlx.core as m; print(m.__version__)' 2>/dev/null) && "
            "{ printf '%s\\n%s\\n' \"$q\" \"$v\"; break; }; "
            "done; true")


# On a Mac, whether sudo asks no password; false elsewhere. The facts command has the system
# in ``$mlxops_os`` (no ``uname`` of its own); run alone, the read asks ``uname``.
_SUDO = 'if [ "${mlxops_os-$(uname -s)}" = Darwin ]; then sudo -n true; else false; fi'


# Runs in the facts' interpreter after the facts' probe: when that imported mlx.core, the
# facts say so already; else the other candidates, in turn, each in its own process.
_FIND = (
    "import sys\n"
    "if 'mlx.core' not in sys.modules:\n"
    "    import shutil, subprocess\n"
    "    for c in sys.argv[1:]:\n"
    "        p = shutil.which(c)\n"
    "        r = p and subprocess.run([p, '-c', 'import mlx.core as m; print(m.__version__)'],\n"
    "                                 capture_output=True, text=True)\n"
    "        if r and r.returncode == 0 and r.stdout.strip():\n"
    "            print(p); print(r.stdout.strip()); break\n"
)


@dataclass(frozen=True)
class _Run:
    """What :func:`~mlxops.tasks.facts.gather` reads of a host: its interpreter and root."""

    python: str
    root: str


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


def probe_reads(candidates: Sequence[str], peers: Sequence[str]
                ) -> dict[str, str | PythonRead]:
    """init's reads, riding along in the facts command that runs in ``candidates[0]``."""
    reads: dict[str, str | PythonRead] = {
        "init.python": PythonRead(_FIND, tuple(candidates[1:])), "init.sudo": _SUDO}
    if peers:
        reads["init.reach"] = PythonRead(_REACH, tuple(peers))
    return reads


def probe(conn, host, pythons: Sequence[str] = (), peers: Sequence[str] = ()) -> Probed:
    """Read ``host`` over ``conn`` (a trusted connection), trying ``peers`` (addresses);
    raises RuntimeError when the facts command does not answer."""
    own = [host.python] if host.is_set("mlxops_python") else []
    candidates = list(dict.fromkeys([*own, *pythons, *CANDIDATES]))
    reads = probe_reads(candidates, peers)
    # gather()'s steps, keeping the sections: the addresses are the facts' own section
    result = conn.run(facts_script(candidates[0], host.root, reads), timeout=60)
    sections = split_sections(result.stdout)
    if "uname" not in sections:
        raise RuntimeError(f"gathering facts failed: {result.error_line()}")
    facts, answers = build_facts(sections, host.root), read_answers(sections, reads)
    parsed = parse_ifconfig_addresses(sections.get("ifconfig", "")) if facts.is_darwin \
        else parse_ip_addr(sections.get("ip", ""))
    if facts.python.mlx:
        lines = [facts.python.path, facts.python.mlx]
    elif facts.python.path:
        found = answers.get("init.python")
        lines = found.stdout.split() if found else []
    else:  # no first candidate there: no Python ran; the others by a command of their own
        lines = conn.run(_python_read(candidates[1:]), timeout=60).stdout.split()
    reach = answers.get("init.reach")
    tried = frozenset(peers) if reach is not None and reach.exit_code == 0 else frozenset()
    ports = dict(facts.macos.hardware_ports) if facts.macos else {}
    return Probed(facts, NodeLinks(ports, parsed),
                  lines[0] if lines else None, lines[1] if len(lines) > 1 else None,
                  getattr(answers.get("init.sudo"), "exit_code", 1) == 0,
                  tried, tried & frozenset(reach.stdout.split()) if tried else frozenset())


# Runs in the node's interpreter (the facts', or the one with mlx): for every address given,
# at once (non-blocking connections and select: no threads to start), whether the host
# there answers TCP: a connection to port 9 (discard: closed on every Mac and Linux host by
# default) refused by the host's kernel (an RST) or accepted; only where nothing came back
# in a second (a firewall that drops, as macOS's stealth mode does for a closed port), a
# connection to port 22 (Remote Login: open on every peer), a second more.
# The closed port first because an answer from sshd's port costs the peer a process (sshd
# forks and execs a session for each connection, and logs it): 15 a Mac on 16 Macs, where
# the kernel's RST costs nothing. Prints the addresses that answered.
_REACH = (
    "import errno, select, socket, sys, time\n"
    "def tries(addresses, port):\n"
    "    socks, found = {}, set()\n"
    "    for a in addresses:\n"
    "        s = socket.socket(); s.setblocking(False)\n"
    "        code = s.connect_ex((a, port))\n"
    "        if code in (0, errno.ECONNREFUSED): found.add(a); s.close()\n"
    "        elif code == errno.EINPROGRESS: socks[s] = a\n"
    "        else: s.close()\n"
    "    end = time.monotonic() + 1\n"
    "    while socks and time.monotonic() < end:\n"
    "        _, done, _ = select.select([], list(socks), [], max(0, end - time.monotonic()))\n"
    "        for s in done:\n"
    "            code = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)\n"
    "            if code in (0, errno.ECONNREFUSED): found.add(socks[s])\n"
    "            del socks[s]; s.close()\n"
    "    for s in socks: s.close()\n"
    "    return found\n"
    "wanted = sys.argv[1:]\n"
    "found = tries(wanted, 9)\n"
    "found |= tries([a for a in wanted if a not in found], 22)\n"
    "print('\\n'.join(a for a in wanted if a in found))\n"
)


def reaches(conn, python: str, addresses: Sequence[str]) -> set[str]:
    """Which of ``addresses`` answer the node over TCP (:data:`_REACH`), as
    ``mlx.distributed_config`` checks that a peer answers on an address before using it.
    Raises RuntimeError when the command fails."""
    if not addresses:
        return set()
    result = conn.run(shell.join([python, "-c", _REACH, *addresses]), timeout=30)
    if result.exit_code != 0:
        raise RuntimeError(f"trying the peers' addresses failed: {result.error_line()}")
    return set(result.stdout.split()) & set(addresses)
