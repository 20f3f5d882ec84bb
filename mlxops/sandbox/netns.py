"""Kernel plumbing: the bridge, one network namespace + veth pair per node, tc shaping.

Thin wrappers over ``ip`` and ``tc`` (iproute2). Creation fails loudly; removal is
forgiving (a missing object is already removed), so ``down`` is idempotent.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import subprocess
import time

from mlxops.errors import MlxopsError
from mlxops.sandbox.layout import Layout, NodeLayout, SubnetPool, tbf_burst_bytes
from mlxops.transport.results import failure_line


def run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise MlxopsError(f"{' '.join(argv)}: "
                          f"{failure_line(proc.returncode, proc.stdout, proc.stderr)}")
    return proc


def netns_exists(name: str) -> bool:
    return os.path.exists(f"/run/netns/{name}")


def link_exists(name: str) -> bool:
    return os.path.exists(f"/sys/class/net/{name}")


def netns_usable() -> str | None:
    """None if this process can make network namespaces, else why not."""
    probe = f"mxprobe{os.getpid()}"
    proc = run(["ip", "netns", "add", probe], check=False)
    if proc.returncode != 0:
        return f"ip netns add failed: {proc.stderr.strip()}"
    run(["ip", "netns", "del", probe], check=False)
    return None


def subnet_in_use(layout: Layout) -> str | None:
    """What of this machine already uses the sandbox subnet, if anything (see
    :func:`conflict`)."""
    return conflict(layout.subnet, taken())


def taken() -> list[tuple[ipaddress.IPv4Network, bool, str]]:
    """The root namespace's IPv4 addresses and routes: (network, is an address, what).

    Routes count as well as addresses: another program's network namespace is reached
    through a route (``10.232.5.0/24 via 10.99.0.2``, or ``dev`` its veth) that needs no
    address of that subnet here; a sandbox bridge on the same subnet would add a second
    route for it, and the kernel takes the first: our nodes' packets would go there.
    """
    out = []
    for link in json.loads(run(["ip", "-j", "-4", "addr", "show"]).stdout or "[]"):
        for addr in link.get("addr_info", []):
            if addr.get("local"):
                net = ipaddress.IPv4Interface(f"{addr['local']}/{addr.get('prefixlen', 32)}")
                out.append((net.network, True, f"{addr['local']} on {link.get('ifname')}"))
    routes = run(["ip", "-j", "-4", "route", "show", "table", "all"]).stdout
    for route in json.loads(routes or "[]"):
        dst = route.get("dst", "default")
        if dst == "default" or route.get("type") in ("local", "broadcast"):
            continue  # default: less specific than any sandbox's; local: its address
        where = " ".join(f"{word} {route[key]}" for key, word in
                         (("gateway", "via"), ("dev", "dev"), ("table", "table")) if route.get(key))
        out.append((ipaddress.IPv4Network(dst, strict=False), False, f"route {dst} {where}"))
    return out


def conflict(subnet: ipaddress.IPv4Network,
             used: list[tuple[ipaddress.IPv4Network, bool, str]]) -> str | None:
    """The first thing in ``used`` (:func:`taken`) that the subnet collides with: an
    address whose network overlaps it, or a route as specific as the subnet's own or more,
    inside it (a wider route, a default or a VPN's 10.0.0.0/8, loses to the bridge's)."""
    for net, is_address, what in used:
        if net.overlaps(subnet) if is_address else net.subnet_of(subnet):
            return what
    return None


def create_bridge(layout: Layout) -> None:
    br = layout.bridge
    run(["ip", "link", "add", br, "type", "bridge"])
    run(["ip", "addr", "add", f"{layout.controller_ip}/{layout.subnet.prefixlen}", "dev", br])
    run(["ip", "link", "set", br, "up"])


def create_node_net(layout: Layout, node: NodeLayout, rate_bits: int | None,
                    iface: str = "eth0") -> None:
    """Namespace, veth pair (host end in the bridge, ``iface`` inside: eth0, or en0 on a
    Mac-like node, as its tools and Open MPI's interface list must agree), addresses,
    shaping."""
    ns = ["ip", "-n", node.netns]
    run(["ip", "netns", "add", node.netns])
    run(["ip", "link", "add", node.veth, "type", "veth",
         "peer", "name", iface, "netns", node.netns])
    run(["ip", "link", "set", node.veth, "master", layout.bridge])
    run(["ip", "link", "set", node.veth, "up"])
    run([*ns, "link", "set", "lo", "up"])
    run([*ns, "addr", "add", f"{node.ip}/{layout.subnet.prefixlen}", "dev", iface])
    run([*ns, "link", "set", iface, "up"])
    if rate_bits:
        shape_link(node, rate_bits, iface)


def shape_link(node: NodeLayout, rate_bits: int | None, iface: str = "eth0") -> None:
    """Shape the node's link to ``rate_bits`` both ways (None: unshaped). Egress of both
    ends: the host end shapes traffic to the node, ``iface`` traffic from it; so a link
    between two nodes runs at the slower of their rates."""
    if rate_bits is None:
        run(["tc", "qdisc", "del", "dev", node.veth, "root"], check=False)
        run(["tc", "-n", node.netns, "qdisc", "del", "dev", iface, "root"], check=False)
        return
    shape = ["root", "tbf", "rate", f"{rate_bits}bit",
             "burst", str(tbf_burst_bytes(rate_bits)), "latency", "50ms"]
    run(["tc", "qdisc", "replace", "dev", node.veth, *shape])
    run(["tc", "-n", node.netns, "qdisc", "replace", "dev", iface, *shape])


def set_link(node: NodeLayout, up: bool) -> None:
    run(["ip", "link", "set", node.veth, "up" if up else "down"])


ISOLATE_TABLE = "mlxops_isolate"


def block_ssh_from(node: NodeLayout, source_ip: str | None, port: int | None = 22) -> None:
    """Drop the TCP packets ``source_ip`` sends to the node's port 22 (``port``; None:
    every port), in the node's own namespace (an nftables table of ours; ``source_ip``
    None deletes it): the node is then reached only from elsewhere, e.g. through another
    node as a jump host."""
    ns = ["ip", "netns", "exec", node.netns, "nft"]
    run([*ns, "delete", "table", "inet", ISOLATE_TABLE], check=False)
    if source_ip is None:
        return
    script = (f"table inet {ISOLATE_TABLE} {{\n"
              "  chain input {\n"
              "    type filter hook input priority 0; policy accept;\n"
              f"    ip saddr {ipaddress.IPv4Address(source_ip)} "
              f"{'meta l4proto tcp' if port is None else f'tcp dport {int(port)}'} drop\n"
              "  }\n"
              "}\n")
    proc = subprocess.run([*ns, "-f", "-"], input=script, capture_output=True, text=True)
    if proc.returncode != 0:
        raise MlxopsError(f"nft in {node.netns}: "
                          f"{failure_line(proc.returncode, proc.stdout, proc.stderr)}")


def netns_pids(name: str) -> list[int]:
    if not netns_exists(name):
        return []
    out = run(["ip", "netns", "pids", name], check=False).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def kill_netns_processes(names: list[str], grace: float = 2.0) -> None:
    """SIGTERM everything left in these namespaces (ssh sessions, ranks), then SIGKILL."""
    pids = [pid for name in names for pid in netns_pids(name)]
    for pid in pids:
        send_signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
        time.sleep(0.05)
    for name in names:
        for pid in netns_pids(name):
            send_signal(pid, signal.SIGKILL)


def delete_node_net(node: NodeLayout) -> None:
    # Deleting the namespace destroys eth0 and so its veth peer; the explicit delete
    # covers a half-made node whose veth never reached the namespace.
    if netns_exists(node.netns):
        run(["ip", "netns", "del", node.netns], check=False)
    if link_exists(node.veth):
        run(["ip", "link", "del", node.veth], check=False)


def delete_bridge(layout: Layout) -> None:
    if link_exists(layout.bridge):
        run(["ip", "link", "del", layout.bridge], check=False)


def send_signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours is dead for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def free_subnet(second_octets: range, seed: int) -> str:
    """A /24 ``10.<o>.<n>.0/24`` (``o`` in ``second_octets``) that nothing here uses.

    ``seed`` (a pid, say) spreads concurrent callers over different subnets; only
    :meth:`mlxops.sandbox.Sandbox.up` with a :class:`~mlxops.sandbox.layout.SubnetPool`
    chooses and takes one under the machine's lock (two callers of this may get the same).
    """
    return str(pick_subnet(SubnetPool(second_octets, seed)))


def pick_subnet(pool: SubnetPool) -> ipaddress.IPv4Network:
    used = taken()
    for net in pool.candidates():
        if conflict(net, used) is None:
            return net
    raise MlxopsError(f"no free {pool.describe()} subnet")
