"""Each sandbox node advertises ``_ssh._tcp`` over mDNS on its bridge, as a Mac with
Remote Login does, so that ``mlxops init`` finds the nodes as it finds Macs.

One responder per node: this file run as a script inside the node's namespace (``ip
netns exec NS python mdns.py NAME IP``) registers the service with python-zeroconf's own
:class:`~zeroconf.ServiceInfo` (instance ``NAME``, host ``NAME.local.``, the node's address,
port 22) on the node's address only, and answers until SIGTERM, when it unregisters (the
goodbye packet). ``sandbox up`` starts them after the nodes log in and records each pid in
state.json (``mdns_pid``); ``sandbox down`` stops them by those pids. As a script it
imports only the standard library and zeroconf (the controller's environment).
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

SERVICE = "_ssh._tcp.local."
_procs: list[subprocess.Popen] = []


def start(netns: str, name: str, ip: str, log: Path) -> int:
    """Start the responder of node ``name`` in namespace ``netns``; returns its pid (``ip
    netns exec`` execs the interpreter: the pid is the responder's own)."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(["ip", "netns", "exec", netns, sys.executable, __file__,
                                 name, ip], stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                start_new_session=True)
    _procs.append(proc)  # reaped at stop, never left a zombie that looks alive
    return proc.pid


def is_ours(pid: int) -> bool:
    """``pid`` still runs this file (a recycled pid is left alone)."""
    try:
        return __file__ in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


def stop(pid: int | None, grace: float = 3.0) -> None:
    """SIGTERM the responder ``pid`` (its goodbye sent), SIGKILL if it lingers."""
    if not pid or not is_ours(pid):
        return
    import os

    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while is_ours(pid) and time.monotonic() < deadline:
        for proc in list(_procs):
            if proc.poll() is not None:
                _procs.remove(proc)
        time.sleep(0.02)
    if is_ours(pid):
        os.kill(pid, signal.SIGKILL)


def serve(name: str, ip: str) -> None:
    """Register ``name`` at ``ip``:22 and answer until SIGTERM."""
    from zeroconf import IPVersion, ServiceInfo, Zeroconf

    info = ServiceInfo(SERVICE, f"{name}.{SERVICE}", port=22, server=f"{name}.local.",
                       addresses=[socket.inet_aton(ip)], properties={})
    zc = Zeroconf(interfaces=[ip], ip_version=IPVersion.V4Only)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    try:
        zc.register_service(info)
        print(f"advertising {name}.{SERVICE} at {ip}:22", flush=True)
        while not stopping:
            time.sleep(0.2)
    finally:
        zc.unregister_all_services()
        zc.close()


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2])
