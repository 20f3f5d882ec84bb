"""A job's ``finetune:`` section, on the controller: parsed once at load, placed per node.

The section is the fine-tuning config (:mod:`mlxops.finetune.config`, docs/finetune.md),
parsed by its own rules into :class:`FinetuneConfig` when the job file loads, before any
host is contacted; a wrong key is one line naming the file and the key
(``job.yml: finetune.method.rank: must be positive, got 0``). Then what only the
controller can check: ``model.path`` and ``data.path`` are directories on the controller
(relative to the job file), the model has its ``config.json``, the data its
``train.jsonl`` (and ``valid.jsonl`` when the run validates). They are kept absolute.

Two keys belong to mlxops, not to the user: ``out`` (the job's run directory on each
node) and ``train.balance`` (from the job's ``balance:``, as for the bundled trainer).

Each rank gets a copy (:func:`rank_finetune`) whose paths are the node's: the model and
the data are placed under the node root by :mod:`mlxops.jobs.content` (hash-checked, only
what differs travels), so ``model.path`` and ``data.path`` name those places.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from mlxops.errors import bad_input
from mlxops.finetune import config as finetune_config
from mlxops.finetune.config import FinetuneConfig
from mlxops.jobs.content import Content, any_directory

SECTION = "finetune"
#: What a base model directory must hold (the rest is the loader's business: mlx-lm's).
MODEL_MARKER = "config.json"
TRAIN_FILE, VALID_FILE = "train.jsonl", "valid.jsonl"


def parse_finetune(path: Path, section: Any) -> FinetuneConfig:
    """The ``finetune:`` section of job file ``path`` as its config, paths absolute."""
    if not isinstance(section, dict):
        raise bad_input(path, SECTION, "must be a mapping (model:, method:, data:, "
                                       "train:)")
    if "out" in section:
        raise bad_input(path, f"{SECTION}.out", "is set by mlxops (the job's run directory)")
    if isinstance(section.get("train"), dict) and "balance" in section["train"]:
        raise bad_input(path, f"{SECTION}.train.balance", "is set by mlxops from the job's "
                                                          "'balance:' (equal, auto or "
                                                          "host: weight)")
    try:
        cfg = finetune_config.from_dict(dict(section), where=SECTION)
    except finetune_config.ConfigError as exc:
        raise bad_input(path, None, problem(exc)) from None
    cfg.model.path = str(_directory(path, "model.path", cfg.model.path, [MODEL_MARKER],
                                    "a model in the Hugging Face / mlx-lm layout"))
    wanted = [TRAIN_FILE] + ([VALID_FILE] if cfg.train.eval_every else [])
    cfg.data.path = str(_directory(path, "data.path", cfg.data.path, wanted,
                                   "mlx-lm's data directory"))
    return cfg


def problem(exc: Exception) -> str:
    """The config says ``finetune: method.rank: ...``; the job file's way is
    ``finetune.method.rank: ...``."""
    message = str(exc)
    prefix = f"{SECTION}: "
    return f"{SECTION}." + message[len(prefix):] if message.startswith(prefix) else message


def _directory(path: Path, key: str, value: str, wanted: list[str], what: str) -> Path:
    directory = (path.parent / value).resolve()
    if not directory.is_dir():
        raise bad_input(path, f"{SECTION}.{key}", f"no such directory: {value} (relative to "
                                                  "the job file)")
    for name in wanted:
        if not (directory / name).is_file():
            raise bad_input(path, f"{SECTION}.{key}", f"{value} has no {name} ({what})")
    return directory


def rank_finetune(cfg: FinetuneConfig, balance: str | list[float], model_dir: str,
                  data_dir: str, run_dir: str) -> FinetuneConfig:
    """The config as a node's ranks get it: the node's copies of the model and the data,
    the job's run directory, ``train.balance`` from the job. A copy."""
    out = copy.deepcopy(cfg)
    out.model.path, out.data.path, out.out = model_dir, data_dir, run_dir
    out.train.balance = balance
    return out


def check_world(path: Path, cfg: FinetuneConfig, balance: str | list[float], world: int,
                hosts: str) -> None:
    """The config's own rule for ``world`` ranks (a global batch they divide, one weight
    per rank), before any rank starts."""
    ranked = copy.deepcopy(cfg)
    ranked.train.balance = balance
    try:
        finetune_config.check_world(ranked, world, where=SECTION)
    except finetune_config.ConfigError as exc:
        raise bad_input(path, None, f"{problem(exc)}; the hosts {hosts!r} give {world} "
                                    "ranks (their mlxops_slots)") from None


# --- the model and the data on every node ---------------------------------------------------


def contents(cfg: FinetuneConfig) -> list[Content]:
    """The base model's and the data's directories, hashed on the controller (through
    :func:`mlxops.jobs.content.any_directory`'s cache): once per launch, not per node."""
    return [any_directory(Path(cfg.model.path)), any_directory(Path(cfg.data.path))]


def listed(cfg: FinetuneConfig) -> list[Content]:
    """The same directories with their files' sizes only (nothing hashed): what
    ``mlxops check`` compares with a node's copy to count the bytes pre-flight would send."""
    out = []
    for directory in (Path(cfg.model.path), Path(cfg.data.path)):
        files = {p.relative_to(directory).as_posix(): ("", p.stat().st_size)
                 for p in sorted(directory.rglob("*")) if p.is_file()}
        out.append(Content(directory, files))
    return out

