"""``finetune:``: fine-tuning a model in mlx-lm's layout (docs/finetune.md).

Parsed once by the fine-tuning config's own rules (:mod:`mlxops.jobs.finetune`);
``model.path`` and ``data.path`` stay the controller's directories (absolute) for good:
the record keeps them, ``plan`` and ``check`` read the model there, and a fetched
``adapter_config.json`` names them (:meth:`FinetuneWorkload.adapters_config`). The node's
copies are values placement computes (:meth:`FinetuneWorkload.rank_config`:
:meth:`mlxops.jobs.content.Content.node_dir` of the node's root), never written back.

``stages:`` (``auto``, or blocks per host in ring order; docs/pipeline.md) makes it a
pipeline: one rank per host, each holding its blocks; ``auto`` is split by memory at
launch from the nodes' facts with fine-tuning's plan (:mod:`mlxops.finetune.stageplan`),
an explicit list is checked against the model's blocks here and against the nodes'
budgets at launch (:mod:`mlxops.jobs.stagesplit`). The ranks get it as ``train.stages``.

Checked at load against the model's ``config.json`` (its ``num_hidden_layers``), as
mlx-lm's ``lora`` checks it when it starts (it refuses ``num_layers`` above the model's
blocks; -1 is all of them): a ``method.num_layers`` the user wrote that is larger is
refused with both numbers; left out, it is ``min(16, blocks)`` - the default of 16 means
"the last 16 blocks", and a smaller model has fewer, so all of them.
"""

from __future__ import annotations

import copy
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
    STAGES_AUTO,
    NodePlacement,
    PipelineCosts,
    Planner,
    RankPlan,
    Workload,
    config_rank_plan,
    stages_value,
)
from mlxops.node import protocol
from mlxops.node.protocol.collectives import SEND_RECV
from mlxops.trainer.config import BALANCE_EQUAL

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


def _stages(path: Path, section: Any) -> tuple[Any, Any]:
    """``(section without stages, the stages value)``: ``stages`` is the job's key, and
    ``train.stages`` is mlxops's (set from it)."""
    if not isinstance(section, dict):
        return section, None
    if isinstance(section.get("train"), dict) and "stages" in section["train"]:
        raise bad_input(path, f"{KIND}.train.stages", f"is set by mlxops from '{KIND}.stages:' "
                                                      "(auto or blocks per host)")
    return {k: v for k, v in section.items() if k != "stages"}, section.get("stages")


def _stage_rules(path: Path, section: dict[str, Any]) -> None:
    """What the config's own rules refuse with stages (a validation across them, a
    balance), checked before the directories are: one stage stands for the split."""
    data = copy.deepcopy(section)
    train = data.get("train") if isinstance(data.get("train"), dict) else {}
    data["train"] = {**train, "stages": [1]}
    try:
        finetune_config.from_dict(data, KIND)
    except finetune_config.ConfigError as exc:
        raise bad_input(path, None, section_rules.problem(exc)) from None


@dataclass(frozen=True)
class FinetuneWorkload(Workload):
    config: FinetuneConfig
    #: ``stages: auto`` not split yet (launch splits it: :mod:`mlxops.jobs.stagesplit`);
    #: an explicit or split one is ``config.train.stages``.
    auto_stages: bool = False

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
        section, value = _stages(path, section)
        if value is not None:
            _stage_rules(path, section)
        cfg = section_rules.parse_finetune(path, section)
        _num_layers(path, cfg, section)
        stages = stages_value(path, f"{KIND}.stages", value, model_blocks(cfg.model.path or ""),
                              f"{LAYERS_KEY} in {cfg.model.path}/config.json")
        if isinstance(stages, list):
            cfg.train.stages = stages
        return cls(cfg, auto_stages=stages == STAGES_AUTO)

    @property
    def one_rank_per_host(self) -> bool:  # type: ignore[override]
        """Pipeline stages: one rank per host, the hosts in ring order."""
        return self.auto_stages or self.config.train.stages is not None

    def to_record(self) -> dict[str, Any]:
        return self.config.to_dict() | ({"stages": STAGES_AUTO} if self.auto_stages else {})

    @classmethod
    def from_record(cls, data: Any) -> FinetuneWorkload:
        data = dict(data)
        auto = data.pop("stages", None) == STAGES_AUTO
        return cls(finetune_config.from_dict(data, f"job.{KIND}"), auto_stages=auto)

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
        stages = self.config.train.stages
        if self.one_rank_per_host and balance != BALANCE_EQUAL:
            raise bad_input(path, "balance", f"splits the batch; the stages of {KIND}.stages "
                                             "each take the whole batch (leave balance: out)")
        if stages is not None and len(stages) != world:
            raise bad_input(path, f"{KIND}.stages", f"{stages} gives {len(stages)} hosts "
                                                    f"blocks; the hosts {hosts!r} are {world} "
                                                    "(one stage per host)")
        if self.one_rank_per_host:
            return   # each stage takes the whole batch: nothing to divide
        section_rules.check_world(path, self.config, balance, world, hosts)

    def collectives(self, world: int) -> tuple[str, ...]:
        """Pipeline stages pass activations and their gradients with ``send``/``recv``."""
        return (SEND_RECV,) if self.one_rank_per_host and world > 1 else ()

    def pipeline(self) -> PipelineCosts | None:
        """The model's blocks as fine-tuning's plan costs them
        (:func:`mlxops.finetune.stageplan.finetune_costs`), the whole global batch in
        micro-batches of at most ``train.micro_batch`` examples."""
        if not self.one_rank_per_host:
            return None
        from mlxops.finetune.plan import read_model
        from mlxops.finetune.stageplan import finetune_costs, read_ends
        from mlxops.trainer.plansearch import cut

        t = self.config.train
        micro = cut(t.global_batch, t.micro_batch)
        accum = -(-t.global_batch // t.micro_batch)
        costs = finetune_costs(read_model(self.model_dir), read_ends(self.model_dir),
                               self.config, micro)
        return PipelineCosts(costs, accum, micro, None if self.auto_stages else t.stages,
                             f"{KIND}.stages")

    @property
    def stages(self) -> list[int] | None:  # type: ignore[override]
        return self.config.train.stages

    def spreads_checkpoints(self) -> bool:
        """Pipeline stages: each writes its own ``ckpt/stage-<s>/``, which a resume on
        another split needs on other nodes (:mod:`mlxops.jobs.ckptmove`)."""
        return self.one_rank_per_host

    def stage_layers(self) -> list[int] | None:
        stages = self.config.train.stages
        return list(stages) if self.one_rank_per_host and stages is not None else None

    def with_split(self, layers: list[int]) -> FinetuneWorkload:
        config = copy.deepcopy(self.config)
        config.train.stages = list(layers)
        return FinetuneWorkload(config, auto_stages=self.auto_stages)

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
