"""RDMA readiness: can this Mac take part in a jaccl job? One pure rule over its facts.

``mlxops check`` asks it for every host of a jaccl (or jaccl-ring) job or inventory. The
wanted devices are the host's ``mlxops_rdma`` values for the peers it runs with
(``{device: [peers]}``); the facts are :class:`~mlxops.hostfacts.RdmaState` and
:class:`~mlxops.hostfacts.MacState` (``rdma_ctl status``, ``ibv_devinfo -v``,
``system_profiler SPThunderboltDataType``, ``ifconfig``; see mlxops/macnet.py).
Findings, in the order a user fixes them (each names the device and the fix):

1. ``rdma_ctl`` missing: macOS before 26.2 has no RDMA over Thunderbolt; update.
2. RDMA disabled: enable it in Recovery (``rdma_ctl enable``) or System Settings, then
   reboot this Mac. Nothing further is judged: the devices only appear after that.
3. Enabled and no device at all: the switch takes effect at boot, so reboot this Mac
   (ml-explore/mlx#3777 saw this survive a reboot on one release: then it is the release).
4. A wanted device missing: device names change after a reboot or re-cabling; the finding
   lists the devices there are, for ``mlxops_rdma``.
5. Its port not ``PORT_ACTIVE``: no cable, or the peer is off; if cabled, reboot this Mac.
6. Its interface held by the Thunderbolt Bridge (``bridge0`` ``member:``): jaccl's init
   fails with errno 22; turn the bridge service off.
7. No cable to another Mac faster than 40 Gb/s: Thunderbolt 4/3 cannot do RDMA although
   macOS makes ``rdma_en*`` devices for its ports (exo-explore/exo#1813). Judged per Mac,
   not per device: ``system_profiler`` does not say which ``enX`` a receptacle is.
8. The device's limits below the job's needs. jaccl opens, per device, one protection
   domain and one queue pair per peer on that device, and registers at least one memory
   region per peer; so ``max_pd >= 1``, ``max_qp >= peers``, ``max_mr >= peers``. (MLX
   registers more regions for its buffers, ml-explore/mlx#3162; this is a lower bound.)
   The limits are capacities, not what is free: resources a crashed run left behind
   (errno 16, "Couldn't allocate protection domain") show only at init, and only a
   reboot frees them (:mod:`mlxops.jobs.jacclinit`).

The macOS build being the same everywhere is :func:`mlxops.readiness.agreement`'s finding
(check_versions_agree).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mlxops.hostfacts import HostFacts
from mlxops.macnet import TB4_GBPS

REBOOT = "reboot this Mac"
ENABLE = ("enable RDMA: in Recovery run `rdma_ctl enable` (or System Settings > "
          "Enable RDMA over Thunderbolt on recent releases), then " + REBOOT)
BRIDGE_FIX = ("turn the Thunderbolt Bridge off: networksetup -setnetworkserviceenabled "
              "'Thunderbolt Bridge' off (or remove the port from it in System Settings)")


@dataclass(frozen=True)
class RdmaFinding:
    """One reason the host is not ready, and its fix."""

    device: str | None   # None: the whole Mac
    found: str
    fix: str

    @property
    def line(self) -> str:
        where = f"{self.device}: " if self.device else ""
        return f"{where}{self.found} ({self.fix})"


def wanted_devices(rdma: Mapping[str, object] | None, peers: Sequence[str]
                   ) -> dict[str, list[str]]:
    """``mlxops_rdma`` (``{peer: device or [devices]}``) as ``{device: [peers]}`` for the
    peers that take part."""
    wanted: dict[str, list[str]] = {}
    for peer, device in (rdma or {}).items():
        if peer not in peers:
            continue
        for name in device if isinstance(device, list) else [device]:
            wanted.setdefault(str(name), []).append(peer)
    return wanted


def rdma_findings(facts: HostFacts, wanted: Mapping[str, Sequence[str]]
                  ) -> list[RdmaFinding]:
    """What stops this Mac's RDMA devices ``wanted`` (``{device: [peers]}``) from carrying
    a jaccl job; empty when nothing does."""
    state = facts.rdma
    if state is None:
        return [RdmaFinding(None, f"no rdma_ctl (macOS {facts.macos_version or '?'}): RDMA "
                                  "over Thunderbolt needs macOS 26.2 or later",
                            "update macOS on every Mac of the job to the same release")]
    if state.enabled is False:
        return [RdmaFinding(None, "RDMA is disabled (rdma_ctl status)", ENABLE)]
    if state.enabled is None:
        return [RdmaFinding(None, "rdma_ctl status said neither enabled nor disabled",
                            f"run rdma_ctl status on the Mac; {REBOOT} if it hangs")]
    if not state.devices:
        return [RdmaFinding(None, "RDMA is enabled but ibv_devinfo lists no device",
                            f"{REBOOT} (the setting takes effect at boot)")]
    findings: list[RdmaFinding] = []
    present = ", ".join(d.name for d in state.devices)
    members = set(facts.macos.bridge_members) if facts.macos else set()
    for name, peers in wanted.items():
        device = state.device(name)
        towards = ", ".join(peers)
        if device is None:
            findings.append(RdmaFinding(name, f"no such device (there are: {present})",
                                        f"set mlxops_rdma towards {towards} to the device "
                                        "cabled to it: names change after a reboot or "
                                        "re-cabling"))
            continue
        if device.port_state != "PORT_ACTIVE":
            findings.append(RdmaFinding(name, f"port {device.port_state or 'state unknown'}",
                                        f"connect its Thunderbolt 5 cable to {towards}; if "
                                        f"it is connected, {REBOOT}"))
        if device.interface in members:
            findings.append(RdmaFinding(name, f"{device.interface} is held by the "
                                              "Thunderbolt Bridge (bridge0)", BRIDGE_FIX))
        need = {"max_pd": 1, "max_qp": len(peers), "max_mr": len(peers)}
        short = [f"{k} {getattr(device, k)} < {v}" for k, v in need.items()
                 if getattr(device, k) is not None and getattr(device, k) < v]
        if short:
            findings.append(RdmaFinding(name, "device limits below the job's needs: "
                                              + ", ".join(short),
                                        f"give this device fewer peers in mlxops_rdma; "
                                        f"if its limits read 0, {REBOOT}"))
    speeds = [link.speed_gbps for link in state.links if link.speed_gbps is not None]
    if wanted and speeds and max(speeds) <= TB4_GBPS:
        findings.append(RdmaFinding(None, f"its Thunderbolt cables to other Macs run at "
                                          f"{max(speeds)} Gb/s (Thunderbolt 4 or older): "
                                          "RDMA needs Thunderbolt 5 (80 Gb/s)",
                                    "cable Thunderbolt 5 ports with Thunderbolt 5 cables, "
                                    "or run the job with backend: ring"))
    return findings
