"""The job file (docs/job-file.md): loaded and validated before anything touches a host.

Read with the one YAML reader (:mod:`mlxops.yamlfile`: a key written twice is refused).
Every error is one line naming the file and the key, e.g.
``jobs/tiny.yml: restart.stall_timeout: must be a positive number, got 'soon'``.
The ``trainer:`` section is parsed once, here, by the trainer's own rules
(:mod:`mlxops.trainer.config`) into its config type: every later reader (launch, plan,
check, the rank files, the record) takes that :class:`TrainerConfig`, never the mapping.
What needs the job's hosts, and so its number of ranks, is checked once they are known
(:func:`check_world`); the ranks' own copy gets ``train.balance`` (:func:`rank_config`).
A ``finetune:`` section is parsed the same way, by the fine-tuning config's own rules
(:mod:`mlxops.jobs.finetune`).
"""

from __future__ import annotations

import copy
import math
import re
import shlex
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlxops import shell
from mlxops.errors import bad_input
from mlxops.finetune.config import FinetuneConfig
from mlxops.jobs import finetune as finetune_section
from mlxops.jobs.data import DataSpec, apply_manifest, parse_data
from mlxops.jobs.policy import (  # noqa: F401 - RestartPolicy and the keys: their old home
    ALERT_DEFAULTS,
    RESTART_KEYS,
    RestartPolicy,
    flag,
    number,
    parse_alerts,
    parse_restart,
)
from mlxops.jobs.servespec import ServeSpec, parse_serve
from mlxops.node.protocol import BACKENDS, DEFAULT_BACKEND
from mlxops.notify import config as notify_config
from mlxops.trainer import config as trainer_config
from mlxops.trainer.config import TrainerConfig
from mlxops.yamlfile import read_yaml

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
TOP_KEYS = {"name", "inventory", "hosts", "backend", "trainer", "command", "workdir", "env",
            "restart", "port", "stop_grace", "blas", "alerts", "balance", "notify", "data",
            "serve", "finetune"}
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
    hosts: str = "all"
    backend: str = DEFAULT_BACKEND
    trainer: TrainerConfig | None = None       # the bundled trainer's config, or
    command: list[str] | None = None           # the user's own command (words)
    workdir: Path | None = None                # synced to <root>/code/jobs/<name>/
    env: dict[str, str] = field(default_factory=dict)
    restart: RestartPolicy = field(default_factory=RestartPolicy)
    port: int = 0                              # first ring port; 0 = derived from the name
    stop_grace: float = 5.0                    # seconds between SIGTERM and SIGKILL
    blas: str = BLAS_AUTO                      # BLAS_MODES: OpenBLAS preloaded on Linux
    alerts: dict[str, float] = field(default_factory=lambda: dict(ALERT_DEFAULTS))
    balance: str | dict[str, float] = BALANCE_EQUAL  # equal | auto | {host: weight}
    # ``notify:`` as written (checked; read over the inventory's ``mlxops_notify`` by
    # :func:`mlxops.jobs.notifying.job_notify` once the inventory is known).
    notify: dict[str, Any] | bool | None = None
    data: DataSpec | None = None               # prepared shards (mlxops data prepare)
    serve: ServeSpec | None = None             # mlx-lm's server instead (servespec.py)
    finetune: FinetuneConfig | None = None     # or fine-tuning (docs/finetune.md)

    @property
    def total_steps(self) -> int | None:
        """The run's steps when mlxops knows them (its own trainer or fine-tuning)."""
        if self.trainer is not None:
            return self.trainer.train.steps
        if self.finetune is not None and not self.finetune.train.epochs:
            return self.finetune.train.steps
        return None

    @property
    def needs_mlx_lm(self) -> bool:
        """The job runs mlx-lm's code on its nodes: pre-flight and ``mlxops check --job``
        require mlx-lm there (:func:`mlxops.readiness.mlx_lm_findings`)."""
        return self.finetune is not None or self.serve is not None

    @property
    def base_port(self) -> int:
        # A per-name default keeps two jobs on one cluster off each other's ports.
        return self.port or 20000 + (zlib.crc32(self.name.encode()) % 2000) * 10


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

    trainer, command, serve = data.get("trainer"), data.get("command"), data.get("serve")
    finetune = data.get("finetune")
    if sum(x is not None for x in (trainer, command, serve, finetune)) != 1:
        raise bad_input(path, "trainer", "give exactly one of 'trainer:' (the bundled "
                                         "trainer), 'finetune:' (fine-tuning a model), "
                                         "'serve:' (mlx-lm's server) or 'command:' (your "
                                         "own program)")
    if serve is not None:
        serve = parse_serve(path, serve)
    raw_trainer = trainer
    if trainer is not None:
        trainer = parse_trainer(path, trainer)
    if finetune is not None:
        finetune = finetune_section.parse_finetune(path, finetune)
    prepared = None
    if data.get("data") is not None:
        prepared = parse_data(path, data["data"])
        apply_manifest(path, prepared, trainer, raw_trainer)
    if command is not None:
        command = _command_words(path, command)
    workdir = data.get("workdir")
    if workdir is not None:
        if command is None:
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
        path=path.resolve(), name=name, inventory=inventory_path, hosts=hosts, backend=backend,
        trainer=trainer, command=command, workdir=workdir, env=env,
        restart=parse_restart(path, data.get("restart")),
        port=_port(path, data.get("port", 0)),
        stop_grace=float(number(path, "stop_grace", data.get("stop_grace", 5.0))),
        blas=_blas(path, data.get("blas", BLAS_AUTO)),
        alerts=parse_alerts(path, data.get("alerts")),
        balance=_balance(path, data.get("balance", BALANCE_EQUAL),
                         trainer is not None or finetune is not None),
        notify=_notify(path, data.get("notify")),
        data=prepared,
        serve=serve,
        finetune=finetune,
    )


def _notify(path: Path, data: Any) -> dict[str, Any] | bool | None:
    try:
        notify_config.check_section(data if data is not None else {})
    except notify_config.NotifyError as exc:
        raise bad_input(path, "notify" + (f".{exc.subkey}" if exc.subkey else ""),
                        exc.problem) from None
    return data


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


def rank_config(spec: JobSpec, rank_hosts: Sequence[str]) -> TrainerConfig:
    """The job's trainer config as its ranks get it: ``train.balance`` set from
    ``balance:``. A copy: the job's own config is unchanged."""
    if spec.trainer is None:
        raise ValueError(f"{spec.name} runs its own command, not the bundled trainer")
    config = copy.deepcopy(spec.trainer)
    config.train.balance = rank_weights(spec, rank_hosts)
    return config


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


def _command_words(path: Path, command: Any) -> list[str]:
    if isinstance(command, str):
        try:
            words = shlex.split(command)
        except ValueError as exc:
            raise bad_input(path, "command", f"cannot split into words: {exc}") from None
    elif isinstance(command, list) and all(isinstance(w, (str, int, float)) for w in command):
        words = [str(w) for w in command]
    else:
        raise bad_input(path, "command", "must be a list of words or one command line")
    if not words:
        raise bad_input(path, "command", "is empty")
    return words


def parse_trainer(path: Path, trainer: Any) -> TrainerConfig:
    """The trainer's own loader parses the section (it names the key that is wrong)."""
    if not isinstance(trainer, dict):
        raise bad_input(path, "trainer", "must be a mapping (model:, data:, train:)")
    if "out" in trainer:
        raise bad_input(path, "trainer.out", "is set by mlxops (the job's run directory)")
    if isinstance(trainer.get("train"), dict) and "balance" in trainer["train"]:
        raise bad_input(path, "trainer.train.balance", "is set by mlxops from the job's "
                                                       "'balance:' (equal, auto or host: weight)")
    try:
        return trainer_config.from_dict(dict(trainer), where="trainer")
    except trainer_config.ConfigError as exc:
        raise bad_input(path, None, _trainer_problem(exc)) from None


def _trainer_problem(exc: Exception) -> str:
    # The trainer says "trainer: model.dims: ..."; make it "trainer.model.dims: ...".
    message = str(exc)
    if message.startswith("trainer: "):
        message = "trainer." + message[len("trainer: "):]
    return message


def check_world(spec: JobSpec, world: int, rank_hosts: Sequence[str] | None = None) -> None:
    """Refuse a trainer config that the job's number of ranks breaks (``world``: the
    ``mlxops_slots`` of its hosts, summed; ``rank_hosts``: the host of each rank, for the
    job's ``balance:``), by the trainer's own rule, before any rank starts:
    ``job.yml: trainer.train.global_batch: 10 is not divisible by ...``."""
    if spec.finetune is not None:
        balance = (rank_weights(spec, rank_hosts) if rank_hosts is not None
                   else spec.balance if isinstance(spec.balance, str) else BALANCE_EQUAL)
        finetune_section.check_world(spec.path, spec.finetune, balance, world, spec.hosts)
        return
    if spec.trainer is None:
        return  # the user's own command: its rules are its own
    cfg = rank_config(spec, rank_hosts) if rank_hosts is not None else spec.trainer
    try:
        trainer_config.check_world(cfg, world, where="trainer")
    except trainer_config.ConfigError as exc:
        raise bad_input(spec.path, None, f"{_trainer_problem(exc)}; the hosts {spec.hosts!r} "
                                         f"give {world} ranks (their mlxops_slots)") from None
