"""The node accounts: one per login shell (``mlxnode`` bash, ``mlxnodez`` zsh), shared by
every sandbox of the machine, each node's home bind-mounted over the account's.

Made under the machine's sandbox lock (:mod:`mlxops.sandbox.hostlock`, which says why:
two ``useradd`` of one name at once leave the account with a uid the first caller never
saw), and read back once made: what the caller chowns the node homes to is the account
as it stays.
"""

from __future__ import annotations

import os
import pwd
from pathlib import Path

from mlxops.errors import MlxopsError
from mlxops.sandbox.netns import run

SHADOW = Path("/etc/shadow")


def ensure_user(user: str, login_shell: str = "/bin/bash") -> pwd.struct_passwd:
    """The node account: created if missing, with ``login_shell`` (set again if an earlier
    sandbox made it with another), and unlocked for key-only login. The caller holds the
    machine's sandbox lock."""
    if not os.access(login_shell, os.X_OK):
        raise MlxopsError(f"login shell {login_shell} is not installed (apt-get install "
                          f"{os.path.basename(login_shell)})")
    if not _exists(user):
        made = run(["useradd", "--system", "--create-home", "--home-dir", f"/home/{user}",
                    "--shell", login_shell, user], check=False)
        if made.returncode != 0:
            raise MlxopsError(f"useradd {user}: {made.stderr.strip()}")
    if pwd.getpwnam(user).pw_shell != login_shell:
        run(["usermod", "--shell", login_shell, user])
    # useradd leaves the account locked ("!"), and sshd with UsePAM no refuses locked
    # accounts even for public keys; "*" means no password but not locked.
    if password_field(user) != "*":
        run(["usermod", "-p", "*", user])
    entry = pwd.getpwnam(user)
    Path(entry.pw_dir).mkdir(parents=True, exist_ok=True)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation dir
    return entry


def _exists(user: str) -> bool:
    try:
        pwd.getpwnam(user)
    except KeyError:
        return False
    return True


def password_field(user: str, shadow: Path | None = None) -> str | None:
    """The account's password field in ``/etc/shadow`` (``*``: no password, not locked;
    ``!...``: locked), or None when it has no line there (or shadow is unreadable)."""
    try:
        lines = (shadow or SHADOW).read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split(":")
        if fields[0] == user and len(fields) > 1:
            return fields[1]
    return None
