"""The machine's sandbox lock: what every sandbox of this machine shares is taken by one
``up`` at a time.

What a sandbox makes is its own (its directory, its prefix's names, its subnet), but two
things belong to the machine: the node accounts in ``/etc/passwd`` (one per login shell,
shared by every sandbox) and the addresses every sandbox picks its subnet from. Taking
either is check-then-act, and two ``up`` at once (the test suite's xdist workers) raced:

- ``useradd NAME`` run by two processes at once: both exit 0, and the second *replaces*
  the first's entry with a new uid and gid (shadow-utils 4.13 looks the name up before it
  locks the files). A sandbox that read the first uid made its nodes' homes that uid's;
  its sshd, reading ``authorized_keys`` as the account's real uid, could not open it
  (``Permission denied (publickey)`` at the client). Reproduced: three ``useradd`` of one
  name at once, the uid seen changed every time.
- a free subnet chosen by two processes before either made its bridge: the same one.

So the account (made, unlocked, read back) and the subnet (chosen, checked, its bridge
made so that the next chooser sees its address) are taken under this lock. ``flock``: a
holder that dies releases it. It is held for milliseconds to a second, never while the
node interpreter builds (that has its own lock, :mod:`mlxops.sandbox.python`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mlxops import filelock

#: Machine-wide, whatever the sandbox cache (``MLXOPS_SANDBOX_CACHE``) of the caller: the
#: accounts and addresses it guards are the machine's.
LOCK = Path("/run/lock/mlxops-sandbox.lock")


@contextmanager
def held(path: Path = LOCK) -> Iterator[None]:
    """Hold the machine's sandbox lock (waiting for another holder)."""
    with filelock.exclusive(path):
        yield
