"""Who supervises a job, and how its watchdog is started, found and stopped on a node.

Policy (docs/supervisor.md):

- A job names the host whose watchdog supervises it (``supervisor: HOST`` in the job file;
  else the inventory's ``mlxops_supervisor``, set once under ``all: vars``; else, and for
  ``controller``, the controller, as before). A named host must be a host of the inventory:
  refused before any host is touched, naming the file and the key (exit 2).
- On a node, the watchdog is the controller's own code (``python -m mlxops watch NAME``,
  :mod:`mlxops.jobs.watch`), shipped at every launch into ``<mlxops_root>/supervisor/jobs/NAME/lib``
  (:mod:`mlxops.jobs.supervising`) and run by ``<mlxops_root>/supervisor/venv/bin/python``,
  the venv the opt-in ``supervisor`` provision task makes over the node's ``mlxops_python``
  with the controller's dependencies installed. Its state (``MLXOPS_HOME``) is
  ``<mlxops_root>/supervisor/home``: the job record, the timeline, the metrics mirror.
- It runs detached from SSH: on Linux under ``systemd-run --user`` where the user's
  manager lingers (without linger, systemd ends a user's services at logout), else
  ``setsid`` + ``nohup``; on a Mac as a ``launchd`` user agent, bootstrapped into the GUI
  domain (``gui/UID``) when the user is logged in there, else the user domain
  (``user/UID``), with ``KeepAlive`` on an unsuccessful exit so that a crashed watchdog is
  started again. The launchd path is rendered and tested as text here, never run: it is
  untested on a Mac.
- Exactly one supervisor per job: the watchdog holds ``watch.lock`` in its job directory
  (``flock``, its pid written in it, :func:`mlxops.jobs.record.supervisor_lock`); the lock
  is the lease. :func:`lease_command` asks a node who holds it: a lock held means a live
  holder (the kernel drops it when the process dies, however it dies), so its pid is safe
  to signal.
"""

from __future__ import annotations

import os
import posixpath
import textwrap
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from mlxops import shell
from mlxops.errors import bad_input

# The site's layout and names, shared with the provision task below this room: re-exported
from mlxops.supervisorsite import (  # noqa: F401
    CONTROLLER,
    ENV_HOST,
    IMPORTS,
    KEY_FILE,
    SITE_DIR,
    VARIABLE,
    Site,
)

SETSID, SYSTEMD, LAUNCHD = "setsid", "systemd", "launchd"
METHODS = (SETSID, SYSTEMD, LAUNCHD)


def supervised_elsewhere(record: Any) -> bool:
    """True when a node supervises ``record``'s job and this process is not that
    watchdog: it may follow the job, never supervise it."""
    return (record.supervisor is not None
            and os.environ.get(ENV_HOST) != record.supervisor.host)


def supervisor_of(job_file: Path, chosen: str | None, hosts: Iterable[Any],
                  inventory: Any) -> Any | None:
    """The inventory host that supervises the job, or None for the controller.

    ``chosen``: the job file's ``supervisor:`` (wins); else the job's hosts'
    ``mlxops_supervisor``, which they must agree on. Exit 2 naming the file and the key
    when it names no host of ``inventory``.
    """
    if chosen is None:
        found: dict[str | None, str] = {}
        for host in hosts:
            found.setdefault(host.var(VARIABLE), host.name)
        if len(found) > 1:
            raise bad_input(inventory.path, VARIABLE, f"differs between the hosts of one job "
                                                      f"({', '.join(found.values())}): set it "
                                                      "once, under all: vars")
        chosen = next(iter(found), None)
        where, key = inventory.path, VARIABLE
    else:
        where, key = job_file, "supervisor"
    if chosen is None or chosen == CONTROLLER:
        return None
    if chosen not in inventory.hosts:
        raise bad_input(where, key, f"no host named {chosen!r} in {inventory.path} (the "
                                    "host that supervises the job, or 'controller')")
    host = inventory.hosts[chosen]
    if host.connection == "local":
        return None  # the controller itself: supervised here, as by default
    return host


def start_command(site: Site, method: str) -> str:
    """The POSIX sh line that starts the watchdog detached, by ``method``; it returns at
    once, the watchdog's output going to :attr:`Site.log`."""
    mkdir = f"mkdir -p {shell.quote(site.job_dir)} && "
    if method == SETSID:
        # No job control in sh -c: the child is no group leader, so setsid makes it one of
        # its own session, away from sshd's; nohup and the redirections cut it from SSH.
        return (mkdir + f"nohup setsid {shell.with_env(site.argv(), site.env())} "
                f"</dev/null >>{shell.quote(site.log)} 2>&1 &")
    if method == SYSTEMD:
        sets = [f"--setenv={k}={v}" for k, v in site.env().items()]
        argv = ["systemd-run", "--user", "--quiet", "--collect", f"--unit={site.label}",
                f"--property=StandardOutput=append:{site.log}",
                f"--property=StandardError=append:{site.log}", *sets, *site.argv()]
        return mkdir + shell.join(argv)
    if method == LAUNCHD:
        plist = posixpath.join(site.dir, f"{site.label}.plist")
        return (mkdir + f"umask 077; cat > {shell.quote(plist)} && "
                + launchctl_bootstrap(site.label, plist))
    raise ValueError(f"unknown supervisor method {method!r} (one of {', '.join(METHODS)})")


def start_stdin(site: Site, method: str) -> bytes | None:
    """What :func:`start_command` reads on stdin: the launchd agent's plist."""
    return launchd_plist(site).encode() if method == LAUNCHD else None


#: Which way a node starts a supervisor: launchd on a Mac; systemd where the user's
#: manager answers and lingers (else it would end the watchdog at logout); else setsid.
METHOD_COMMAND = (
    'if [ "$(uname -s)" = Darwin ]; then echo launchd; '
    "elif command -v systemd-run >/dev/null 2>&1 "
    "&& systemctl --user show-environment >/dev/null 2>&1 "
    '&& [ "$(loginctl show-user "$(id -un)" -p Linger --value 2>/dev/null)" = yes ]; '
    "then echo systemd; "
    "elif command -v setsid >/dev/null 2>&1; then echo setsid; "
    "else echo none; fi"
)


def launchd_plist(site: Site) -> str:
    """The user agent (launchd.plist(5)): the watchdog, its environment, its log; started
    at load, and again when it exits unsuccessfully (``KeepAlive.SuccessfulExit`` false:
    a watchdog that ends with its job exits 0 and stays down)."""
    # Here, not at the top: xml.sax.saxutils imports urllib.request, which a launch has no
    # use for before its first connection (tests/unit/test_startup.py).
    from xml.sax.saxutils import escape

    args = "".join(f"\n    <string>{escape(a)}</string>" for a in site.argv())
    env = "".join(f"\n    <key>{escape(k)}</key>\n    <string>{escape(v)}</string>"
                  for k, v in site.env().items())
    return textwrap.dedent("""\
        <?xml version="1.0" encoding="UTF-8"?>
        <!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" \
"http://www.apple.com/DTDs/PropertyList-1.0.dtd">
        <plist version="1.0">
        <dict>
          <key>Label</key>
          <string>{label}</string>
          <key>ProgramArguments</key>
          <array>{args}
          </array>
          <key>EnvironmentVariables</key>
          <dict>{env}
          </dict>
          <key>WorkingDirectory</key>
          <string>{dir}</string>
          <key>RunAtLoad</key>
          <true/>
          <key>KeepAlive</key>
          <dict>
            <key>SuccessfulExit</key>
            <false/>
          </dict>
          <key>ProcessType</key>
          <string>Background</string>
          <key>StandardOutPath</key>
          <string>{log}</string>
          <key>StandardErrorPath</key>
          <string>{log}</string>
        </dict>
        </plist>
        """).format(label=escape(site.label), args=args, env=env, dir=escape(site.dir),
                    log=escape(site.log))


def _launchd_domain() -> str:
    """``gui/UID`` when the user has a GUI session (an always-on Mac logged in), else
    ``user/UID`` (launchctl(1): the user domain exists without a login)."""
    return ('u=$(id -u); if launchctl print "gui/$u" >/dev/null 2>&1; then d="gui/$u"; '
            'else d="user/$u"; fi')


def launchctl_bootstrap(label: str, plist: str) -> str:
    """Load the agent, replacing an earlier one of the same label (launchctl(1):
    ``bootout`` then ``bootstrap DOMAIN PATH``)."""
    return (_launchd_domain() + f'; launchctl bootout "$d"/{shell.quote(label)} '
            f'>/dev/null 2>&1; launchctl bootstrap "$d" {shell.quote(plist)}')


def launchctl_bootout(label: str) -> str:
    return (_launchd_domain() + f'; launchctl bootout "$d"/{shell.quote(label)} '
            ">/dev/null 2>&1; true")


#: Run by the node's python with the lock's path: who holds the lease. Prints
#: ``{"held": bool, "pid": int|null}``; with ``stop GRACE`` it also ends the holder:
#: SIGTERM, SIGKILL after GRACE seconds, until the lock is free. Stdlib only.
LEASE_SOURCE = textwrap.dedent("""\
    import fcntl, json, os, signal, sys, time
    path, action = sys.argv[1], sys.argv[2:]

    def look():
        try:
            f = open(path)
        except FileNotFoundError:
            return False, None
        with f:
            try:
                fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                text = f.read().strip()
                return True, int(text) if text.isdigit() else None
            fcntl.flock(f, fcntl.LOCK_UN)
            return False, None

    held, pid = look()
    was = pid
    if action and action[0] == "stop" and held:
        grace = float(action[1])
        deadline = time.monotonic() + grace
        sig = signal.SIGTERM
        while held:
            if pid:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)
            if time.monotonic() > deadline:
                sig = signal.SIGKILL
            held, pid = look()
    print(json.dumps({"held": held, "pid": pid if held else was}))
    """)


def lease_command(python: str, site: Site, stop_grace: float | None = None) -> str:
    """The node command that answers :data:`LEASE_SOURCE`'s JSON for ``site``'s lock
    (``python``: any interpreter there; the node env's will do)."""
    argv: list[object] = [python, "-c", LEASE_SOURCE, site.lock]
    if stop_grace is not None:
        argv += ["stop", stop_grace]
    return shell.join(argv)


def stop_command(python: str, site: Site, method: str, grace: float) -> str:
    """Stop the supervisor for good: its service manager first (launchd would start it
    again, systemd would report it failed), then whoever holds the lease."""
    first = {LAUNCHD: launchctl_bootout(site.label) + "; ",
             SYSTEMD: f"systemctl --user stop {shell.quote(site.label)} >/dev/null 2>&1; ",
             }.get(method, "")
    return first + lease_command(python, site, grace)


def known_hosts_lines(entries: Sequence[tuple[str, str, str]]) -> str:
    """known_hosts text for ``(name, key type, base64 key)`` the controller verified."""
    return "".join(f"{name} {kind} {key}\n" for name, kind, key in sorted(set(entries)))
