"""The job file (docs/job-file.md): loaded and validated before anything touches a host.

Read with the one YAML reader (:mod:`mlxops.yamlfile`: a key written twice is refused).
Every error is one line naming the file and the key, e.g.
``jobs/tiny.yml: restart.stall_timeout: must be a positive number, got 'soon'``.
What the job runs (``trainer:``, ``finetune:``, ``serve:`` or ``command:``) is parsed
once, here, into its workload (:mod:`mlxops.jobs.workloads`): every later reader (launch,
plan, check, the rank files, the record) asks :attr:`JobSpec.workload`, never the mapping.
``notify:`` is parsed once too (:class:`mlxops.notify.config.NotifySection`), and read
over the inventory's default when the job's hosts are known
(:mod:`mlxops.jobs.notifying`). What needs the job's hosts, and so its number of ranks,
is checked once they are known (:func:`check_world`).
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlxops import shell
from mlxops.errors import bad_input
from mlxops.jobs.data import DataSpec, parse_data
from mlxops.jobs.policy import (  # noqa: F401 - RestartPolicy and the keys: their old home
    ALERT_DEFAULTS,
    RESTART_KEYS,
    RestartPolicy,
    flag,
    number,
    parse_alerts,
    parse_restart,
)
from mlxops.jobs.workloads import KINDS, Workload, section_of
from mlxops.node.protocol import BACKENDS, DEFAULT_BACKEND
from mlxops.notify import config as notify_config
from mlxops.notify.config import NotifySection
from mlxops.trainer import config as trainer_config
from mlxops.yamlfile import read_yaml

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
TOP_KEYS = {"name", "inventory", "hosts", "backend", "workdir", "env", "restart", "port",
            "stop_grace", "blas", "alerts", "balance", "notify", "data", *KINDS}
#: ``blas:``: preload a Linux node's OpenBLAS into every rank (auto), or leave MLX's own.
BLAS_AUTO, BLAS_OFF = "auto", "off"
BLAS_MODES = (BLAS_AUTO, BLAS_OFF)
#: ``balance:``: how the trainer splits the global batch over unequal nodes (docs/job-file.md):
#: the trainer's own modes (``train.balance``), or a mapping of host: weight.
BALANCE_EQUAL, BALANCE_AUTO = trainer_config.BALANCE_EQUAL, trainer_config.BALANCE_AUTO


@dataclass(frozen=True)
class JobSpec:
    path: Path
    name: str
    inventory: Path
    workload: Workload                         # what it runs (jobs/workloads/)
    hosts: str = "all"
    backend: str = DEFAULT_BACKEND
    workdir: Path | None = None                # synced to <root>/code/jobs/<name>/
    env: dict[str, str] = field(default_factory=dict)
    restart: RestartPolicy = field(default_factory=RestartPolicy)
    port: int = 0                              # first ring port; 0 = derived from the name
    stop_grace: float = 5.0                    # seconds between SIGTERM and SIGKILL
    blas: str = BLAS_AUTO                      # BLAS_MODES: OpenBLAS preloaded on Linux
    alerts: dict[str, float] = field(default_factory=lambda: dict(ALERT_DEFAULTS))
    balance: str | dict[str, float] = BALANCE_EQUAL  # equal | auto | {host: weight}
    # ``notify:`` as written, parsed (read over the inventory's ``mlxops_notify`` by
    # :func:`mlxops.jobs.notifying.job_notify` once the inventory is known); None: none.
    notify: NotifySection | None = None
    data: DataSpec | None = None               # prepared shards (mlxops data prepare)

    @property
    def total_steps(self) -> int | None:
        """The run's steps when mlxops knows them (its own trainer or fine-tuning)."""
        return self.workload.total_steps

    @property
    def needs_mlx_lm(self) -> bool:
        """The job runs mlx-lm's code on its nodes: pre-flight and ``mlxops check --job``
        require mlx-lm there (:func:`mlxops.readiness.mlx_lm_findings`)."""
        return self.workload.needs_mlx_lm

    @property
    def base_port(self) -> int:
        return self.port or name_port(self.name)


def name_port(name: str) -> int:
    """A job's first ring port when it sets no ``port:``: a per-name default keeps two
    jobs on one cluster off each other's ports."""
    return 20000 + (zlib.crc32(name.encode()) % 2000) * 10


def _read(path: Path) -> dict[str, Any]:
    data = read_yaml(path, "a job file")
    if not isinstance(data, dict):
        raise bad_input(path, None, "a job file is a mapping (name:, inventory:, ...)")
    return data


def load_job(path: str | Path) -> JobSpec:
    path = Path(path)
    data = _read(path)
    for key in data:
        if key not in TOP_KEYS:
            raise bad_input(path, str(key), f"unknown key (known: {', '.join(sorted(TOP_KEYS))})")
    for key in ("name", "inventory"):
        if key not in data:
            raise bad_input(path, key, "required")
    name = data["name"]
    if not isinstance(name, str) or not NAME.match(name):
        raise bad_input(path, "name", "letters, digits, '.', '_' and '-' only (max 64), "
                                      f"got {name!r}")
    inventory = data["inventory"]
    if not isinstance(inventory, str) or not inventory:
        raise bad_input(path, "inventory", "must be a path (relative to the job file)")
    inventory_path = (path.parent / inventory).resolve()
    if not inventory_path.is_file():
        raise bad_input(path, "inventory", f"no such file: {inventory_path}")
    hosts = data.get("hosts", "all")
    if not isinstance(hosts, str) or not hosts.strip():
        raise bad_input(path, "hosts", "must be a host pattern such as 'all' or 'macs:!mac3'")
    backend = data.get("backend", DEFAULT_BACKEND)
    if backend not in BACKENDS:
        raise bad_input(path, "backend", f"must be one of {', '.join(BACKENDS)}, got {backend!r}")

    kind, section = section_of(path, data)
    prepared = None
    if data.get("data") is not None:
        if not kind.reads_data:
            raise bad_input(path, "data", f"goes with 'trainer:' (the bundled trainer reads "
                                          f"the shards); {kind.what} reads its own data")
        prepared = parse_data(path, data["data"])
    workload = kind.parse(path, section, data=prepared)
    workdir = data.get("workdir")
    if workdir is not None:
        if not kind.takes_workdir:
            raise bad_input(path, "workdir", "goes with 'command:' (the trainer is synced anyway)")
        if not isinstance(workdir, str):
            raise bad_input(path, "workdir", "must be a directory path")
        workdir = (path.parent / workdir).resolve()
        if not workdir.is_dir():
            raise bad_input(path, "workdir", f"no such directory: {workdir}")

    env = data.get("env") or {}
    if not isinstance(env, dict):
        raise bad_input(path, "env", "must be a mapping of NAME: value")
    for k, v in env.items():
        if not isinstance(k, str) or not shell.is_env_name(k):
            raise bad_input(path, f"env.{k}", "not a valid environment variable name")
        if not isinstance(v, (str, int, float, bool)):
            raise bad_input(path, f"env.{k}", "must be a string or a number")
    env = {k: str(v) for k, v in env.items()}

    return JobSpec(
        path=path.resolve(), name=name, inventory=inventory_path, workload=workload,
        hosts=hosts, backend=backend, workdir=workdir, env=env,
        restart=parse_restart(path, data.get("restart")),
        port=_port(path, data.get("port", 0)),
        stop_grace=float(number(path, "stop_grace", data.get("stop_grace", 5.0))),
        blas=_blas(path, data.get("blas", BLAS_AUTO)),
        alerts=parse_alerts(path, data.get("alerts")),
        balance=_balance(path, data.get("balance", BALANCE_EQUAL), kind.splits_batch),
        notify=_notify(path, data.get("notify")),
        data=prepared,
    )


def _notify(path: Path, data: Any) -> NotifySection | None:
    try:
        return notify_config.parse_section(data)
    except notify_config.NotifyError as exc:
        raise bad_input(path, "notify" + (f".{exc.subkey}" if exc.subkey else ""),
                        exc.problem) from None


def _balance(path: Path, value: Any, trainer: bool) -> str | dict[str, float]:
    if value in (BALANCE_EQUAL, BALANCE_AUTO):
        if value == BALANCE_AUTO and not trainer:
            raise bad_input(path, "balance", "goes with 'trainer:' or 'finetune:' (mlxops "
                                             "splits their batch); your 'command:' does its "
                                             "own")
        return value
    if not isinstance(value, dict) or not value:
        raise bad_input(path, "balance", f"must be equal, auto or a mapping of host: weight "
                                         f"(relative speed), got {value!r}")
    if not trainer:
        raise bad_input(path, "balance", "goes with 'trainer:' or 'finetune:' (mlxops "
                                         "splits their batch); your 'command:' does its own")
    out = {}
    for host, weight in value.items():
        if (not isinstance(weight, (int, float)) or isinstance(weight, bool)
                or not math.isfinite(weight) or weight <= 0):
            raise bad_input(path, f"balance.{host}", f"must be a positive number (the host's "
                                                     f"relative speed), got {weight!r}")
        out[str(host)] = float(weight)
    return out


def check_balance(spec: JobSpec, hosts: Sequence) -> None:
    """A ``{host: weight}`` balance names exactly the hosts ``hosts:`` selects (before any
    ``--exclude``: the weights of excluded hosts are simply not used)."""
    if not isinstance(spec.balance, dict):
        return
    names = [h.name for h in hosts]
    for host in spec.balance:
        if host not in names:
            raise bad_input(spec.path, f"balance.{host}", f"not a host of this job (hosts "
                                                          f"{spec.hosts!r}: {', '.join(names)})")
    for host in names:
        if host not in spec.balance:
            raise bad_input(spec.path, "balance", f"no weight for {host} (give every host of "
                                                  "the job a weight, or use auto)")


def rank_weights(spec: JobSpec, rank_hosts: Sequence[str]) -> str | list[float]:
    """``train.balance`` for ranks on ``rank_hosts`` (the host of each rank, in order): the
    mode, or each host's weight shared by its ranks."""
    if not isinstance(spec.balance, dict):
        return spec.balance
    per_host = {h: rank_hosts.count(h) for h in rank_hosts}
    return [spec.balance[h] / per_host[h] for h in rank_hosts]


def _blas(path: Path, value: Any) -> str:
    # YAML reads a bare `off` as false: take it as the word the user wrote.
    if value is False:
        return BLAS_OFF
    if value not in BLAS_MODES:
        raise bad_input(path, "blas", f"must be {' or '.join(BLAS_MODES)}, got {value!r}")
    return value


def _port(path: Path, value: Any) -> int:
    if value == 0:
        return 0
    if not isinstance(value, int) or isinstance(value, bool) or not 1024 <= value <= 65000:
        raise bad_input(path, "port", f"must be a port number from 1024 to 65000, got {value!r}")
    return value


def check_world(spec: JobSpec, world: int, rank_hosts: Sequence[str] | None = None) -> None:
    """Refuse what the job's number of ranks breaks (``world``: the ``mlxops_slots`` of its
    hosts, summed; ``rank_hosts``: the host of each rank, for the job's ``balance:``), by
    the workload's own rule, before any rank starts:
    ``job.yml: trainer.train.global_batch: 10 is not divisible by ...``."""
    balance = (rank_weights(spec, rank_hosts) if rank_hosts is not None
               else spec.balance if isinstance(spec.balance, str) else BALANCE_EQUAL)
    spec.workload.check_world(spec.path, spec.hosts, balance, world)
