"""One sshd per fake node: the node account, keys, sshd_config, start/stop by pid.

Each sshd runs inside its node's network namespace and in a private mount namespace
where the node's own home directory is bind-mounted over the node user's passwd home,
so every node has its own ``~`` (OpenSSH reads ``~/.ssh`` of the passwd home, not
``$HOME``). :func:`node_argv` builds the same wrapper for any command, so tests can look
at a node exactly as its ssh sessions see it.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from mlxops.errors import MlxopsError
from mlxops.sandbox import cgroups, kernels
from mlxops.sandbox.layout import NODE_USER, NodeLayout
from mlxops.sandbox.netns import pid_alive, send_signal
from mlxops.sandbox.python import CACHE_DIR

SSHD = "/usr/sbin/sshd"
SFTP_SERVER = "/usr/lib/openssh/sftp-server"

# Name the node ($1) in its own UTS namespace, bind-mount its home ($2) over the user's
# home ($3), then exec the rest: the pid that ip-netns-exec -> unshare -> sh -> exec
# yields is the final command's pid. A name of its own matters beyond looks: Open MPI's
# orted keeps its session directory at $TMPDIR/ompi.<hostname>.<uid>/, and the nodes share
# $TMPDIR (below); under one name, two nodes' orteds raced for one directory and one
# failed at start ("orte_session_dir failed ... File exists").
_NAME_BIND_AND_EXEC = ('printf %s "$1" > /proc/sys/kernel/hostname && '
                       'mount --bind "$2" "$3" && shift 3 && exec "$@"')
# A Mac-like node (mlxops/sandbox/darwin) also mounts its own directory ($4) where its shims
# look ($5), moves the real /proc there for the ps shim, and hides /proc under an empty
# read-only tmpfs: a Mac has none, and node code must take the path it takes there.
_NAME_BIND_HIDE_PROC_AND_EXEC = (
    'printf %s "$1" > /proc/sys/kernel/hostname && mount --bind "$2" "$3" && '
    'mount --bind "$4" "$5" && mount --bind /proc "$5/proc" && '
    'mount -t tmpfs -o ro,mode=755 tmpfs /proc && shift 5 && exec "$@"')


def keygen(path: Path, comment: str) -> subprocess.Popen:
    """Start an ed25519 ssh-keygen (fast; callers start many and wait for all)."""
    for p in (path, path.with_name(path.name + ".pub")):
        p.unlink(missing_ok=True)
    return subprocess.Popen(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )


def wait_all(procs: list[subprocess.Popen], what: str) -> None:
    for proc in procs:
        _, err = proc.communicate()
        if proc.returncode != 0:
            raise MlxopsError(f"{what} failed: {err.decode(errors='replace').strip()}")


class NodeFiles:
    """The host-side files of one node under ``DIR/nodes/<name>/``."""

    def __init__(self, state_dir: Path, name: str):
        self.dir = state_dir / "nodes" / name
        self.home = self.dir / "home"
        self.host_key = self.dir / "ssh_host_ed25519_key"
        self.sshd_config = self.dir / "sshd_config"
        self.pid_file = self.dir / "sshd.pid"
        self.log = self.dir / "sshd.log"

    def host_key_line(self) -> str:
        """``<type> <base64>`` of the public host key (no comment)."""
        pub = self.host_key.with_name(self.host_key.name + ".pub").read_text().split()
        return f"{pub[0]} {pub[1]}"


def prepare_node(files: NodeFiles, node: NodeLayout, user: pwd.struct_passwd,
                 client_key: Path, known_hosts: str, session_env: dict[str, str] | None = None
                 ) -> None:
    """Home with ``~/.ssh`` owned by the node user, and the sshd_config.

    ``~/.ssh`` holds authorized_keys (the client key's public half) and, for node-to-node
    SSH as a real cluster needs it for ``mpirun``, the client key itself as
    ``id_ed25519`` plus a ``known_hosts`` with every node's host key (strict checking
    stays on).
    """
    files.dir.mkdir(parents=True, exist_ok=True)
    files.dir.chmod(0o755)
    ssh_dir = files.home / ".ssh"
    ssh_dir.mkdir(parents=True, exist_ok=True)
    client_pub = client_key.with_name(client_key.name + ".pub").read_text()
    (ssh_dir / "authorized_keys").write_text(client_pub)
    (ssh_dir / "id_ed25519").write_bytes(client_key.read_bytes())
    (ssh_dir / "id_ed25519.pub").write_text(client_pub)
    ensure_node_tmp(user)
    for path, mode in ((files.home, 0o755), (ssh_dir, 0o700),
                       (ssh_dir / "authorized_keys", 0o600), (ssh_dir / "id_ed25519", 0o600),
                       (ssh_dir / "id_ed25519.pub", 0o644)):
        os.chown(path, user.pw_uid, user.pw_gid)
        os.chmod(path, mode)
    write_node_known_hosts(files, user, known_hosts)
    files.sshd_config.write_text(sshd_config(files, node, user.pw_name, session_env))


def write_node_known_hosts(files: NodeFiles, user: pwd.struct_passwd, text: str) -> None:
    """``~/.ssh/known_hosts`` of the node: every node's host key under its address."""
    path = files.home / ".ssh" / "known_hosts"
    tmp = path.with_name(".known_hosts.tmp")
    tmp.write_text(text)
    os.chown(tmp, user.pw_uid, user.pw_gid)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


# The nodes' temporary directory ($TMPDIR, which macOS also sets per user). Nodes share
# this machine's /tmp otherwise, and MLX's CPU backend compiles kernels with g++ under
# $TMPDIR/mlx/<version>/: a /tmp/mlx made by root (a test run as root) is unwritable for
# the node user. One cache shared by the nodes (sticky, world-writable like /tmp) keeps
# the compiled kernels across nodes and sandboxes: a per-node one made every job's first
# step wait for a fresh g++ run of every kernel, on every node. (mlxops' own ranks compile
# in their run's temporary directory instead, whose mlx/ links to the user's kernel cache:
# mlxops/node/tempdir.py, mlxops/sandbox/kernels.py.)
NODE_TMP = CACHE_DIR / "tmp"
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"


def node_tmp(user: str) -> Path:
    """The node account's $TMPDIR: :data:`NODE_TMP` for the bash account, ``tmp-<user>``
    beside it for another (the zsh one). MLX's ``mlx/<version>/`` under it belongs to the
    account that compiled first: shared by two accounts, every compiled step of the
    other's ranks failed (g++: "No such file or directory"), so each has its own."""
    return NODE_TMP if user == NODE_USER else CACHE_DIR / f"tmp-{user}"


def ensure_node_tmp(user: pwd.struct_passwd) -> Path:
    path = node_tmp(user.pw_name)
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o1777)
    if path != NODE_TMP:
        kernels.seed(NODE_TMP / "mlx", path / "mlx", user)
    return path


def sshd_config(files: NodeFiles, node: NodeLayout, user: str,
                session_env: dict[str, str] | None = None) -> str:
    """``session_env``: what the sessions get beside (or instead of) ``TMPDIR``, e.g. a
    Mac-like node's PATH with its shims first (values hold no spaces)."""
    env = {"TMPDIR": str(node_tmp(user)), **(session_env or {})}
    return "\n".join([
        "SetEnv " + " ".join(f"{k}={v}" for k, v in env.items()),
        f"ListenAddress {node.ip}",
        "Port 22",
        f"HostKey {files.host_key}",
        f"PidFile {files.pid_file}",
        "UsePAM no",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PubkeyAuthentication yes",
        "AuthorizedKeysFile .ssh/authorized_keys",
        "StrictModes yes",
        f"AllowUsers {user}",
        "PermitRootLogin no",
        "UseDNS no",
        "PrintMotd no",
        "PrintLastLog no",
        "X11Forwarding no",
        # Fabric/mlx.launch open many sessions at once; the defaults (10, 10:30:100)
        # make parallel runs flaky.
        "MaxSessions 64",
        "MaxStartups 256",
        f"Subsystem sftp {SFTP_SERVER}",
        "",
    ])


def node_argv(node: NodeLayout, files: NodeFiles, node_user: str, argv: list[str],
              user: str | None = None, env: dict[str, str] | None = None,
              darwin: tuple[Path, Path] | None = None,
              session_env: dict[str, str] | None = None) -> list[str]:
    """argv run in the node's netns with its home mounted over ``node_user``'s home,
    as ``user`` (None = root) with a clean login-like environment (``session_env`` as the
    node's sshd gives it) plus ``env``. ``darwin``: (the node's own directory, where to
    mount it) for a Mac-like node, whose /proc is hidden too."""
    inner = list(argv)
    if user is not None:
        account = pwd.getpwnam(user)
        base = {"HOME": account.pw_dir, "USER": user, "LOGNAME": user,
                "SHELL": account.pw_shell, "PATH": DEFAULT_PATH,
                "TMPDIR": str(node_tmp(user)), **(session_env or {})}
        inner = ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups",
                 "env", "-i", *[f"{k}={v}" for k, v in {**base, **(env or {})}.items()],
                 *inner]
    elif env:
        inner = ["env", *[f"{k}={v}" for k, v in env.items()], *inner]
    passwd_home = pwd.getpwnam(node_user).pw_dir
    wrapper = [cgroups.node_mount_command() + _NAME_BIND_AND_EXEC, "sh", node.name,
               str(files.home), passwd_home]
    if darwin is not None:
        wrapper = [_NAME_BIND_HIDE_PROC_AND_EXEC, "sh", node.name, str(files.home),
                   passwd_home, str(darwin[0]), str(darwin[1])]
    return ["ip", "netns", "exec", node.netns,
            "unshare", "--mount", "--uts", "--propagation", "private",
            "sh", "-c", *wrapper, *inner]


def start_sshd(node: NodeLayout, files: NodeFiles, node_user: str,
               darwin: tuple[Path, Path] | None = None) -> int:
    """Start the node's sshd in the background; returns its pid (not yet listening)."""
    files.pid_file.unlink(missing_ok=True)
    with open(files.log, "ab") as log:
        proc = subprocess.Popen(
            node_argv(node, files, node_user, [SSHD, "-D", "-e", "-f", str(files.sshd_config)],
                      darwin=darwin),
            stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            start_new_session=True,  # a Ctrl-C in the terminal must not reach the nodes
        )
    # Nobody waits for sshd here; reap it in the background so it never lingers as a
    # zombie that looks alive to pid checks.
    _reapers.append(proc)
    return proc.pid


_reapers: list[subprocess.Popen] = []


def wait_listening(nodes: list[NodeLayout], pids: dict[str, int], files: dict[str, NodeFiles],
                   timeout: float = 15.0) -> None:
    """Block until each node's sshd accepts TCP on ip:22 (from the root namespace)."""
    deadline = time.monotonic() + timeout
    pending = list(nodes)
    while pending:
        for node in list(pending):
            if not pid_alive(pids[node.name]):
                raise MlxopsError(f"sshd of {node.name} exited: {tail(files[node.name].log)}")
            try:
                with socket.create_connection((node.ip, 22), timeout=0.5):
                    pending.remove(node)
            except OSError:
                pass
        if pending:
            if time.monotonic() > deadline:
                names = ", ".join(n.name for n in pending)
                raise MlxopsError(f"sshd not listening after {timeout:.0f}s on {names}")
            time.sleep(0.05)


def is_our_sshd(pid: int, files: NodeFiles) -> bool:
    """Guard against pid reuse: the pid must still be this node's sshd."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    # sshd rewrites its argv into one space-separated title ("sshd: /usr/sbin/sshd -D -e
    # -f CFG [listener] ..."), so match the config path as a whole word either way.
    words = cmdline.replace(b"\0", b" ").split()
    return str(files.sshd_config).encode() in words


def stop_sshd(pid: int | None, files: NodeFiles, grace: float = 3.0) -> None:
    """SIGTERM the node's sshd by recorded pid, SIGKILL if it lingers."""
    if not pid or not is_our_sshd(pid, files):
        return
    send_signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while pid_alive(pid) and time.monotonic() < deadline:
        _reap()
        time.sleep(0.02)
    if pid_alive(pid):
        send_signal(pid, signal.SIGKILL)
    _reap()


def _reap() -> None:
    for proc in list(_reapers):
        if proc.poll() is not None:
            _reapers.remove(proc)


def tail(path: Path, lines: int = 3) -> str:
    """The last ``lines`` lines of a log, joined by " | "."""
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return "(no log)"


def remove_node_files(files: NodeFiles) -> None:
    shutil.rmtree(files.dir, ignore_errors=True)
