"""``finetune:``: fine-tuning a model in mlx-lm's layout (docs/finetune.md).

Parsed once by the fine-tuning config's own rules (:mod:`mlxops.jobs.finetune`);
``model.path`` and ``data.path`` stay the controller's directories (absolute) for good:
the record keeps them, ``plan`` and ``check`` read the model there, and a fetched
``adapter_config.json`` names them (:meth:`FinetuneWorkload.adapters_config`). The node's
copies are values placement computes (:meth:`FinetuneWorkload.rank_config`:
:meth:`mlxops.jobs.content.Content.node_dir` of the node's root), never written back.

Checked at load against the model's ``config.json`` (its ``num_hidden_layers``), as
mlx-lm's ``lora`` checks it when it starts (it refuses ``num_layers`` above the model's
blocks; -1 is all of them): a ``method.num_layers`` the user wrote that is larger is
refused with both numbers; left out, it is ``min(16, blocks)`` - the default of 16 means
"the last 16 blocks", and a smaller model has fewer, so all of them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlxops.errors import bad_input
from mlxops.finetune import config as finetune_config
from mlxops.finetune.config import FinetuneConfig
from mlxops.jobs import finetune as section_rules
from mlxops.jobs.content import Content
from mlxops.jobs.data import DataSpec
from mlxops.jobs.workloads.base import (
    NodePlacement,
    Planner,
    RankPlan,
    Workload,
    config_rank_plan,
)
from mlxops.node import protocol

KIND = section_rules.SECTION
#: The model's blocks, in its config.json (Hugging Face's name, which mlx-lm reads).
LAYERS_KEY = "num_hidden_layers"


def model_blocks(model_dir: str | Path) -> int | None:
    """The model's transformer blocks per its ``config.json``; None when it does not say."""
    try:
        config = json.loads((Path(model_dir) / section_rules.MODEL_MARKER).read_text())
    except (OSError, ValueError):
        return None
    value = config.get(LAYERS_KEY) if isinstance(config, dict) else None
    if value is None and isinstance(config, dict):
        value = (config.get("text_config") or {}).get(LAYERS_KEY)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _num_layers(path: Path, cfg: FinetuneConfig, section: dict[str, Any]) -> None:
    """``method.num_layers`` against the model's blocks (module doc)."""
    blocks = model_blocks(cfg.model.path or "")
    if blocks is None:
        return
    given = (section.get("method") or {}).get("num_layers")
    if given is None:
        cfg.method.num_layers = min(cfg.method.num_layers, blocks)
    elif given > blocks:
        raise bad_input(path, f"{KIND}.method.num_layers",
                        f"{given}, but the model at {cfg.model.path} has {blocks} blocks "
                        f"({LAYERS_KEY} in its config.json): at most {blocks}, or -1 for "
                        "all")


@dataclass(frozen=True)
class FinetuneWorkload(Workload):
    config: FinetuneConfig

    kind = KIND
    what = "fine-tuning"
    summary = "fine-tuning a model"
    splits_batch = True
    needs_mlx_lm = True
    exports = True
    adapters = True

    @classmethod
    def parse(cls, path: Path, section: Any, *, data: DataSpec | None = None
              ) -> FinetuneWorkload:
        cfg = section_rules.parse_finetune(path, section)
        _num_layers(path, cfg, section)
        return cls(cfg)

    def to_record(self) -> dict[str, Any]:
        return self.config.to_dict()

    @classmethod
    def from_record(cls, data: Any) -> FinetuneWorkload:
        return cls(finetune_config.from_dict(data, f"job.{KIND}"))

    @property
    def total_steps(self) -> int | None:
        return None if self.config.train.epochs else self.config.train.steps

    @property
    def global_batch(self) -> int | None:
        return self.config.train.global_batch

    @property
    def patience(self) -> int:
        return self.config.train.patience

    @property
    def model_dir(self) -> Path:
        """The base model on the controller."""
        return Path(self.config.model.path or "")

    @property
    def data_dir(self) -> Path:
        return Path(self.config.data.path or "")

    def check_world(self, path: Path, hosts: str, balance: str | list[float],
                    world: int) -> None:
        section_rules.check_world(path, self.config, balance, world, hosts)

    def contents(self) -> list[Content]:
        return section_rules.contents(self.config)

    def listed(self) -> list[Content]:
        return section_rules.listed(self.config)

    def rank_config(self, root: str, run_dir: str, balance: str | list[float]
                    ) -> FinetuneConfig:
        """The config as the ranks under node ``root`` get it: the model and data where
        :mod:`mlxops.jobs.content` places them there, the run directory, the split."""
        return section_rules.rank_finetune(
            self.config, balance, Content(self.model_dir, {}).node_dir(root),
            Content(self.data_dir, {}).node_dir(root), run_dir)

    def rank_plan(self, node: NodePlacement) -> RankPlan:
        config = self.rank_config(node.paths.root, node.paths.run_dir, node.balance)
        return config_rank_plan(node, "mlxops.finetune", protocol.FINETUNE_CONFIG,
                                config.to_dict())

    def planner(self, path: Path) -> Planner:
        from mlxops.finetune.plan import ModelError, read_model

        try:
            shape = read_model(self.model_dir)
        except ModelError as exc:
            raise bad_input(path, f"{KIND}.model.path", str(exc)) from None
        return FinetunePlanner(self.config, shape)

    def adapters_config(self, data: bytes) -> bytes:
        """The node wrote its own copies' paths (``model``, ``data``: mlx-lm's keys, which
        its loaders do not read back; a person or a tool on the controller does, to find
        the base model the adapters go with): the controller's directories instead. A
        config that does not read as a mapping is kept as it came."""
        try:
            config = json.loads(data)
        except ValueError:
            return data
        if not isinstance(config, dict):
            return data
        config.update(model=str(self.model_dir), data=str(self.data_dir))
        return (json.dumps(config, indent=4) + "\n").encode()


@dataclass(frozen=True)
class FinetunePlanner(Planner):
    """Fine-tuning's own plan (:mod:`mlxops.finetune.plan`), from the model's files."""

    config: FinetuneConfig
    shape: Any                       # mlxops.finetune.plan.ModelShape

    unit = "examples"

    def memory(self, memory: int, world: int, *, ranks_per_node: int,
               per_rank: int | None = None, working_set: int | None = None) -> Any:
        from mlxops.finetune.plan import plan_finetune

        return plan_finetune(self.config, self.shape, memory, world,
                             ranks_per_node=ranks_per_node, per_rank=per_rank,
                             working_set=working_set)

    def checkpoints(self) -> tuple[int, int]:
        from mlxops.finetune.plan import plan_disk

        disk = plan_disk(self.shape, self.config)
        return disk.checkpoint_bytes, disk.checkpoints

    def step_work(self, plan: Any) -> tuple[int, int]:
        # Forward over every parameter, backward through the adapted ones: about 6 x
        # params x tokens at most; the wire carries the trainable gradients alone.
        return plan.micro_batch * plan.accumulation * plan.seq_len, plan.trainable_bytes
