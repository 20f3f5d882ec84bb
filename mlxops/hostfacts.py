"""The facts record: what one node is, defined once.

:func:`mlxops.tasks.facts.build_facts` parses the facts command's output into a
:class:`HostFacts`; the facts cache (``controller_home()/facts/<host>.json``), the ``facts``
of ``provision --json`` and a playbook's ``when:`` see it as JSON through :meth:`to_json`;
every reader (tasks, checks, plan, report, selftest) reads its attributes.

JSON comes back through one generic decoder, :func:`decode`: every field of a dataclass is
read by its name, nested dataclasses by their own fields, and a field that has no default
and is absent is named in the error (``facts: missing field 'python.mlx'``). To add a field,
add it here with a default (``None``): caches written before it still load.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")


class FactsError(ValueError):
    """A facts document that does not fit the record (its message names the field)."""


@dataclass
class Interpreter:
    """A Python on the node: its absolute path, ``X.Y.Z`` version, and the mlx it imports
    (None when ``import mlx.core`` fails)."""

    path: str | None
    version: str | None
    mlx: str | None
    # MLX's recommended GPU working set in bytes (a Mac's memory budget); None on the CPU.
    working_set: int | None = None
    # The mlx-lm it has installed (package metadata); None: none. Fine-tuning needs it.
    mlx_lm: str | None = None

    @classmethod
    def none(cls) -> Interpreter:
        """No interpreter found."""
        return cls(path=None, version=None, mlx=None)


@dataclass
class MacState:
    """What a Mac keeps in its kernel and network setup that the ``macos`` task tunes."""

    wired_limit_mb: int | None             # iogpu.wired_limit_mb (0: macOS's own)
    sleep: int | None                      # pmset's system sleep minutes (0: never)
    # Thunderbolt Bridge (bridge0) up holds the ports jaccl needs to itself.
    thunderbolt_bridge_up: bool
    # The interfaces bridge0 holds (``member:`` lines of ifconfig), up or not: a port held
    # by the bridge fails jaccl's init (errno 22) even while the bridge is inactive.
    bridge_members: list[str] = field(default_factory=list)
    # networksetup -listallhardwareports: {device: hardware port} ("en2": "Thunderbolt 2").
    hardware_ports: dict[str, str] = field(default_factory=dict)

    @classmethod
    def unknown(cls) -> MacState:
        return cls(wired_limit_mb=None, sleep=None, thunderbolt_bridge_up=False)


@dataclass
class RdmaDevice:
    """One RDMA device as ``ibv_devinfo -v`` shows it (port 1: Apple's have one port)."""

    name: str                              # rdma_en2: the RDMA side of interface en2
    port_state: str | None                 # PORT_ACTIVE, PORT_DOWN, ...
    link_layer: str | None                 # "Thunderbolt" on a Mac
    max_qp: int | None = None              # queue pairs the device can hold
    max_pd: int | None = None              # protection domains
    max_mr: int | None = None              # memory regions

    @property
    def interface(self) -> str | None:
        """The network interface the device rides on (``rdma_en2`` -> ``en2``)."""
        return self.name[len("rdma_"):] if self.name.startswith("rdma_") else None


@dataclass
class ThunderboltLink:
    """A Thunderbolt bus with another Mac at the end of its cable
    (``system_profiler SPThunderboltDataType -json``)."""

    bus: str                               # thunderboltusb4_bus_1
    speed_gbps: int | None                 # the receptacle's current speed: 80 = TB5
    peer: str | None                       # the peer's model name ("MacBook Pro")


@dataclass
class RdmaState:
    """RDMA over Thunderbolt on a Mac (macOS 26.2+): its switch, devices and cables."""

    enabled: bool | None                   # rdma_ctl status; None: no rdma_ctl (older macOS)
    devices: list[RdmaDevice] = field(default_factory=list)
    links: list[ThunderboltLink] = field(default_factory=list)

    def device(self, name: str) -> RdmaDevice | None:
        return next((d for d in self.devices if d.name == name), None)


@dataclass
class HostFacts:
    """One node as the facts command saw it (None: the node did not say)."""

    system: str | None                     # uname -s: "Darwin" | "Linux"
    hostname: str | None
    arch: str | None
    macos_version: str | None
    macos_build: str | None
    chip: str | None
    memory_bytes: int | None
    cpu_cores: int | None
    perf_cores: int | None
    gpu_cores: int | None
    python: Interpreter                    # mlxops_python (after the python task: the venv)
    venv: Interpreter | None               # mlxops_root/venv, if there is one
    interfaces: dict[str, list[str]]       # {"en0": ["192.168.1.10"]}
    disk_free_bytes: int | None            # free under the node user's home
    root: str | None                       # mlxops_root, absolute as the node sees it
    macos: MacState | None                 # Darwin only
    rdma: RdmaState | None = None          # Darwin only, where rdma_ctl exists

    @classmethod
    def unknown(cls) -> HostFacts:
        """A node that said nothing (not read): every value None."""
        return cls(system=None, hostname=None, arch=None, macos_version=None,
                   macos_build=None, chip=None, memory_bytes=None, cpu_cores=None,
                   perf_cores=None, gpu_cores=None, python=Interpreter.none(), venv=None,
                   interfaces={}, disk_free_bytes=None, root=None, macos=None)

    @property
    def is_darwin(self) -> bool:
        return self.system == "Darwin"

    def interpreter(self) -> Interpreter:
        """The Python jobs run: the venv provision made, else ``mlxops_python``."""
        return self.venv if self.venv is not None and self.venv.path else self.python

    @property
    def ranks_working_set(self) -> int | None:
        """The GPU's recommended working set reported by the MLX the ranks run with (the
        :meth:`interpreter`'s); None without one (MLX's CPU build, an older probe)."""
        value = self.interpreter().working_set
        return value if isinstance(value, int) and value > 0 else None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, doc: Any) -> HostFacts:
        """Raises :class:`FactsError` naming the first missing or misshapen field."""
        return decode(cls, doc, "facts")


def decode(cls: type[T], doc: Any, where: str) -> T:
    """``doc`` (parsed JSON) as dataclass ``cls``; ``where`` prefixes error messages."""
    if not isinstance(doc, Mapping):
        raise FactsError(f"{where}: expected an object, got {type(doc).__name__}")
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name not in doc:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise FactsError(f"{where}: missing field {f.name!r}")
            continue
        values[f.name] = _value(hints[f.name], doc[f.name], f"{where}.{f.name}")
    return cls(**values)


def _value(hint: Any, value: Any, where: str) -> Any:
    """A field's JSON value as its type says: nested dataclasses decoded, the rest as is."""
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    if value is None:
        if type(None) in options:
            return None
        raise FactsError(f"{where}: must not be null")
    for option in options:
        if dataclasses.is_dataclass(option):
            return decode(option, value, where)
        # list[Record] and dict[str, Record]: each item decoded as its record.
        origin, args = typing.get_origin(option), typing.get_args(option)
        if origin is list and args and dataclasses.is_dataclass(args[0]):
            if not isinstance(value, list):
                raise FactsError(f"{where}: expected a list")
            return [decode(args[0], v, f"{where}[{i}]") for i, v in enumerate(value)]
    return value
