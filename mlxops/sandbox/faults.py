"""Breaking sandbox nodes on purpose, and mending them: what tests of failures need.

A Mac whose sshd is gone (connections refused), a Mac asleep (every process of it
frozen: connections hang, nothing answers), a cable pulled (its link down: packets
vanish, connections time out), a Mac only reached through another (a jump host), a host key
unknown or changed, a slower link (shaped to a
rate), a slower machine (a CPU quota). :meth:`Faults.restore` undoes all of them, so a
test that breaks nodes leaves the sandbox as it found it.
"""

from __future__ import annotations

import pwd
from collections.abc import Callable
from typing import Any

from mlxops.sandbox import cgroups, clientfiles, darwin, freezer, netns, nodes
from mlxops.sandbox.darwin import macrdma
from mlxops.sandbox.layout import parse_rate
from mlxops.sandbox.state import SandboxState


class Faults(SandboxState):
    """Per-node controls of a running sandbox (mixed into :class:`Sandbox`)."""

    def stop_node(self, name: str) -> None:
        """Stop only this node's sshd (new connections are refused: host unreachable)."""
        entry = self._entry(name)
        nodes.stop_sshd(entry.get("sshd_pid"), self._files(name))
        entry["sshd_pid"] = None
        self._save()

    def start_node(self, name: str) -> None:
        """(Re)start this node's sshd and wait until it listens."""
        node, entry = self.node_layout(name), self._entry(name)
        if entry.get("sshd_pid") and nodes.is_our_sshd(entry["sshd_pid"], self._files(name)):
            return
        entry["sshd_pid"] = nodes.start_sshd(node, self._files(name), self.user)
        self._save()
        self._wait_listening([node])

    def sleep_node(self, name: str) -> None:
        """Put the node to sleep as a Mac falls asleep: every process of it (sshd, its
        sessions, the ranks) frozen with the cgroup freezer (:mod:`.freezer`). Its TCP
        connections stay open and answer nothing; new ones hang."""
        netns_name = self.node_layout(name).netns
        freezer.freeze(self._freezer(name), netns.netns_pids(netns_name),
                       more=lambda: netns.netns_pids(netns_name))
        self._entry(name)["asleep"] = True
        self._save()

    def wake_node(self, name: str) -> None:
        """Thaw every process of the node: they go on where they were."""
        freezer.thaw(self._freezer(name))
        self._entry(name).pop("asleep", None)
        self._save()

    def mac_faults(self, name: str, *faults: str) -> None:
        """What a Mac-like node's RDMA and port tools answer (none: a Mac ready for
        jaccl); each of :data:`mlxops.sandbox.darwin.macrdma.FAULTS` breaks it as a real
        Mac breaks. :meth:`restore` clears them."""
        unknown = set(faults) - set(macrdma.FAULTS)
        if unknown:
            raise ValueError(f"unknown Mac faults {sorted(unknown)} (known: "
                             f"{', '.join(macrdma.FAULTS)})")
        path = darwin.node_dir(self.dir, name) / "faults"
        path.write_text("".join(f + "\n" for f in faults))
        path.chmod(0o644)

    def asleep(self, name: str) -> bool:
        return bool(self._entry(name).get("asleep"))

    def _freezer(self, name: str) -> str:
        return f"mlxops-sandbox-sleep-{self.layout.prefix}-{name}"

    def disconnect_node(self, name: str) -> None:
        """Take the node's link down: packets vanish (timeouts, not refusals)."""
        netns.set_link(self.node_layout(name), up=False)

    def reconnect_node(self, name: str) -> None:
        netns.set_link(self.node_layout(name), up=True)

    def isolate_node(self, name: str) -> None:
        """Drop the controller's packets to the node's SSH port (in the node's namespace):
        only the other nodes reach it, as a Mac behind a bastion (ProxyJump through one)."""
        netns.block_ssh_from(self.node_layout(name), self.layout.controller_ip)
        self._entry(name)["isolated"] = True
        self._save()

    def set_rate(self, name: str, rate: str | None) -> None:
        """Shape the node's link to ``rate`` (``100mbit``; None: unshaped) both ways, now;
        :meth:`restore` puts back the rate it was made with."""
        entry = self._entry(name)
        netns.shape_link(self.node_layout(name), parse_rate(rate) if rate else None,
                         self.iface)
        entry["shaped"] = rate
        self._save()

    def rate(self, name: str) -> str | None:
        """The node's link rate now (None: unshaped)."""
        entry = self._entry(name)
        return entry.get("shaped", self._made_rate(entry))

    def _made_rate(self, entry: dict) -> str | None:
        # Sandboxes made before rates per node kept one rate for all.
        return entry.get("rate", self._state.get("rate"))

    def set_cpu_quota(self, name: str, fraction: float | None) -> None:
        """Make the node slower: its processes (sshd, sessions, ranks; what it starts
        later too) share ``fraction`` of one CPU (a cgroup, :mod:`mlxops.sandbox.cgroups`);
        None lifts the cap."""
        self._limit(name, "cpu_quota", fraction, cgroups.set_quota, cgroups.clear)

    def set_memory_limit(self, name: str, nbytes: int | None) -> None:
        """Make the node a smaller Mac: its processes share ``nbytes`` of memory (a memory
        cgroup, :mod:`mlxops.sandbox.cgroups`), which its facts read as its memory; None
        lifts the limit."""
        self._limit(name, "memory_limit", nbytes, cgroups.set_memory_limit,
                    cgroups.clear_memory)

    def _limit(self, name: str, key: str, value: Any,
               apply: Callable[[str, list[int], Any], None],
               lift: Callable[[str], None]) -> None:
        """The node's processes put under ``value`` in its cgroup by ``apply`` (None: the
        group removed by ``lift``), kept as ``key`` in its state entry."""
        group = self._cgroup(name)
        entry = self._entry(name)
        if value is None:
            lift(group)
            entry.pop(key, None)
        else:
            apply(group, netns.netns_pids(self.node_layout(name).netns), value)
            entry[key] = value
        self._save()

    def _cgroup(self, name: str) -> str:
        return f"mlxops-sandbox-{self.layout.prefix}-{name}"

    def forget_host_key(self, name: str) -> None:
        """Drop the node from known_hosts: its key becomes unknown to strict clients."""
        ip = self.ip(name)
        lines = self.known_hosts_path.read_text().splitlines(keepends=True)
        kept = [ln for ln in lines if ln.split(" ", 1)[0] not in (ip, name)]
        clientfiles.write_atomic(self.known_hosts_path, "".join(kept))

    def trust_host_key(self, name: str) -> None:
        """Record the node's current host key again (undo forget/regenerate)."""
        self.forget_host_key(name)
        with open(self.known_hosts_path, "a") as f:
            f.write(clientfiles.known_hosts({self.ip(name): self._files(name).host_key_line()}))

    def regenerate_host_key(self, name: str) -> None:
        """Give the node a new host key (known_hosts keeps the old one: a changed key)."""
        files = self._files(name)
        was_running = bool(self.sshd_pid(name))
        self.stop_node(name)
        nodes.wait_all([nodes.keygen(files.host_key, f"{name}@mlxops-sandbox")], "ssh-keygen")
        if was_running:
            self.start_node(name)

    def restore(self) -> None:
        """Undo what the per-node controls did: every node awake, every link up at the rate
        it was made with, no CPU quota or memory limit, no node isolated, every sshd
        running, every current host key trusted (tests that break nodes call this when
        done)."""
        for name in self.nodes:
            if self.asleep(name):
                self.wake_node(name)
            self.reconnect_node(name)
            entry = self._entry(name)
            if "shaped" in entry:
                self.set_rate(name, self._made_rate(entry))
                del entry["shaped"]
                self._save()
            if "cpu_quota" in self._entry(name):
                self.set_cpu_quota(name, None)
            if "memory_limit" in self._entry(name):
                self.set_memory_limit(name, None)
            if self._entry(name).pop("isolated", None):
                netns.block_ssh_from(self.node_layout(name), None)
                self._save()
            if not self.sshd_alive(name):
                self._entry(name)["sshd_pid"] = None
                self.start_node(name)
            darwin.node_dir(self.dir, name).joinpath("faults").unlink(missing_ok=True)
        host_keys = {self.ip(n): self._files(n).host_key_line() for n in self.nodes}
        clientfiles.write_atomic(self.known_hosts_path, clientfiles.known_hosts(host_keys))
        # The nodes' own known_hosts (node-to-node SSH, e.g. mpirun) follow new host keys.
        account = pwd.getpwnam(self.user)
        known = self._nodes_known_hosts()
        for name in self.nodes:
            nodes.write_node_known_hosts(self._files(name), account, known)
