"""The last step of ``up``: log in to every node as the client will, and when one is
refused, say why.

sshd tells the client nothing but ``Permission denied (publickey)``; the reasons are on
this machine, and :func:`login_problems` names the ones a sandbox can have (the order in
which sshd meets them):

- the node account: missing, locked in ``/etc/shadow`` (``!``: sshd with ``UsePAM no``
  refuses it even a key), or its login shell not executable;
- the node's home, ``~/.ssh`` and ``authorized_keys``: each must be the account's (by
  uid: a home chowned to a uid the account no longer has is refused), open to its owner,
  and writable by no one else (``StrictModes``); ``authorized_keys`` must hold the
  client key's public half;
- the client key: ``ssh`` will not use a private key that others can read.

The node's sshd log (``-e``, one file a node) goes with them: it names what sshd saw
(``Could not open user ... authorized keys ...: Permission denied``).
"""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
from pathlib import Path

from mlxops.sandbox.accounts import password_field


def refused_logins(ssh_config: Path, names: list[str], timeout: float = 30
                   ) -> dict[str, str]:
    """``ssh -F ssh_config NODE true`` to every node at once: {node: what ssh said} for
    each that did not log in."""
    probes = {name: subprocess.Popen(
        ["ssh", "-F", str(ssh_config), name, "true"], stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for name in names}
    refused = {}
    for name, proc in probes.items():
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            err = f"no answer in {timeout:.0f}s. {err}"
        if proc.returncode != 0:
            refused[name] = err.strip() or f"ssh exit {proc.returncode}"
    return refused


def login_problems(user: str, home: Path, client_key: Path) -> list[str]:
    """Why sshd may refuse ``client_key`` for ``user`` whose home (as sshd sees it, under
    the bind mount) is ``home``; empty when nothing here explains it."""
    try:
        account = pwd.getpwnam(user)
    except KeyError:
        return [f"the node account {user} does not exist"]
    problems = []
    password = password_field(user)
    if password is not None and password.startswith("!"):
        problems.append(f"the account {user} is locked in /etc/shadow (password field "
                        f"{password!r}); sshd with UsePAM no refuses a locked account")
    if not os.access(account.pw_shell, os.X_OK):
        problems.append(f"the account {user}'s login shell {account.pw_shell} is not "
                        "executable")
    ssh_dir = home / ".ssh"
    for path, need in ((home, 0o500), (ssh_dir, 0o500), (ssh_dir / "authorized_keys", 0o400)):
        problems += _owned_and_private(path, account, need)
    problems += _holds_key(ssh_dir / "authorized_keys", client_key)
    problems += _client_key(client_key)
    return problems


def _owned_and_private(path: Path, account: pwd.struct_passwd, need: int) -> list[str]:
    try:
        st = path.stat()
    except OSError as exc:
        return [f"{path}: {exc.strerror}"]
    found = []
    if st.st_uid != account.pw_uid:
        found.append(f"{path} belongs to {_owner(st.st_uid)}, not to the node account "
                     f"{account.pw_name} (uid {account.pw_uid})")
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o022:
        found.append(f"{path} has mode {mode:04o}: writable by others, which sshd "
                     "(StrictModes) refuses")
    if mode & need != need:
        found.append(f"{path} has mode {mode:04o}: its owner cannot "
                     f"{'read' if need == 0o400 else 'list and enter'} it")
    return found


def _holds_key(authorized_keys: Path, client_key: Path) -> list[str]:
    pub = client_key.with_name(client_key.name + ".pub")
    try:
        want = pub.read_text().split()[:2]
        have = [line.split()[:2] for line in authorized_keys.read_text().splitlines()]
    except OSError:
        return []  # said above, or the client key's own finding below
    if want and want not in have:
        return [f"{authorized_keys} does not hold the client key {pub}"]
    return []


def _client_key(client_key: Path) -> list[str]:
    try:
        st = client_key.stat()
    except OSError as exc:
        return [f"the client key {client_key}: {exc.strerror}"]
    mode = stat.S_IMODE(st.st_mode)
    found = []
    if mode & 0o077:
        found.append(f"the client key {client_key} has mode {mode:04o}: ssh refuses a "
                     "private key that others can read")
    if st.st_uid != os.geteuid():
        found.append(f"the client key {client_key} belongs to {_owner(st.st_uid)}, not to "
                     f"the user running ssh (uid {os.geteuid()})")
    return found


def _owner(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}, which no account has"
