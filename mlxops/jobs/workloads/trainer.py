"""``trainer:``: the bundled trainer (:mod:`mlxops.trainer`, docs/trainer.md).

The section is parsed once, at load, by the trainer's own rules
(:mod:`mlxops.trainer.config`) into its :class:`TrainerConfig`; every later reader takes
that, never the mapping. Two keys are mlxops's: ``out`` (the run directory on each node)
and ``train.balance`` (from the job's ``balance:``, per rank: :meth:`rank_config`).

Checked at load, on the controller, what the ranks would otherwise refuse after they
started, for a job on prepared shards (the job's ``data:``, or ``trainer.data.source:
shards`` at an absolute path the controller can read too):

* ``model.vocab_size`` is the corpus's (its ``manifest.json``): refused when it differs,
  taken from the manifest when not given;
* ``model.seq_len`` leaves the training split at least one window: a shard of ``c_j``
  tokens gives ``(c_j - 1) // seq_len`` windows (:mod:`mlxops.trainer.shards`), and their
  sum must be >= 1; the same for the validation split when ``train.eval_every`` is set.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlxops.errors import bad_input
from mlxops.jobs.data import DataSpec, apply_manifest, rank_data
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
from mlxops.node.protocol.collectives import ALL_GATHER, SEND_RECV
from mlxops.trainer import config as trainer_config
from mlxops.trainer import shardformat
from mlxops.trainer.config import BALANCE_EQUAL, SHARD_AUTO, TrainerConfig

KIND = "trainer"


def problem(exc: Exception) -> str:
    """The trainer says ``trainer: model.dims: ...``; the job file's way is
    ``trainer.model.dims: ...``."""
    message = str(exc)
    return KIND + "." + message[len(KIND) + 2:] if message.startswith(f"{KIND}: ") else message


#: The record's mark of a section whose ``train.shard_optimizer`` was auto (the config
#: holds what launch decided).
SHARD_AUTO_RECORD = "shard_optimizer_auto"


def parse_stages(path: Path, value: Any, layers: int) -> list[int] | str | None:
    """``trainer.stages``: ``auto``, or the layers of each host in ring order, which must
    be the model's ``model.layers`` (docs/pipeline.md)."""
    return stages_value(path, f"{KIND}.stages", value, layers, f"{KIND}.model.layers")


def parse_trainer(path: Path, section: Any) -> TrainerConfig:
    """The trainer's own loader parses the section (it names the key that is wrong);
    ``stages`` is the job's, :func:`parse_stages`'s."""
    if not isinstance(section, dict):
        raise bad_input(path, KIND, "must be a mapping (model:, data:, train:)")
    if "out" in section:
        raise bad_input(path, f"{KIND}.out", "is set by mlxops (the job's run directory)")
    if isinstance(section.get("train"), dict) and "stages" in section["train"]:
        raise bad_input(path, f"{KIND}.train.stages", f"is set by mlxops from '{KIND}.stages:' "
                                                      "(auto or layers per host)")
    section = {k: v for k, v in section.items() if k != "stages"}
    if isinstance(section.get("train"), dict) and "balance" in section["train"]:
        raise bad_input(path, f"{KIND}.train.balance", "is set by mlxops from the job's "
                                                       "'balance:' (equal, auto or host: "
                                                       "weight)")
    try:
        return trainer_config.from_dict(dict(section), where=KIND)
    except trainer_config.ConfigError as exc:
        raise bad_input(path, None, problem(exc)) from None


def with_stages(path: Path, cfg: TrainerConfig, stages: list[int] | str | None
                ) -> TrainerConfig:
    """``cfg`` with an explicit split in ``train.stages``, checked by the trainer's own
    rules (a validation it cannot make across stages, say)."""
    if stages is None:
        return cfg
    cfg = copy.deepcopy(cfg)
    # auto: the same checks, with one stage standing for the split launch makes.
    cfg.train.stages = stages if isinstance(stages, list) else [cfg.model.layers]
    try:
        trainer_config.validate(cfg, KIND)
    except trainer_config.ConfigError as exc:
        raise bad_input(path, None, problem(exc).replace(f"{KIND}.train.stages",
                                                         f"{KIND}.stages")) from None
    if not isinstance(stages, list):
        cfg.train.stages = None
    return cfg


def _corpus(path: Path, cfg: TrainerConfig, section: dict[str, Any],
            data: DataSpec | None) -> None:
    """The load-time checks against the corpus's manifest (module doc)."""
    if data is not None:
        apply_manifest(path, data, cfg, section)
        manifest, where = data.manifest(), "data"
    elif cfg.data.source == shardformat.SHARDS_SOURCE and cfg.data.path \
            and Path(cfg.data.path).is_absolute() \
            and (Path(cfg.data.path) / shardformat.MANIFEST).is_file():
        # The ranks read this path on their nodes; the controller reads the same one (a
        # shared mount, a sandbox): what they would refuse is refused here.
        try:
            manifest = shardformat.read_manifest(Path(cfg.data.path))
        except shardformat.ShardError as exc:
            raise bad_input(path, f"{KIND}.data.path", str(exc)) from None
        given = (section.get("model") or {}).get("vocab_size")
        if given is not None and given != manifest.vocab_size:
            raise bad_input(path, f"{KIND}.model.vocab_size",
                            f"{given}, but the corpus at {cfg.data.path} was tokenized with "
                            f"a vocabulary of {manifest.vocab_size} (leave it out: it is "
                            "taken from its manifest.json)")
        cfg.model.vocab_size = manifest.vocab_size
        where = f"{KIND}.data.path"
    else:
        return
    seq = cfg.model.seq_len
    splits = [(shardformat.TRAIN, "training")]
    if cfg.train.eval_every:
        splits.append((shardformat.VAL, "validation"))
    for split, name in splits:
        windows = sum(max(0, (s.tokens - 1) // seq) for s in manifest.shards(split))
        if windows < 1:
            tokens = manifest.tokens(split)
            raise bad_input(path, f"{KIND}.model.seq_len",
                            f"{seq}, but the {name} split of the corpus ({where}) has "
                            f"{tokens} tokens: no shard holds seq_len + 1 of them (a "
                            "smaller seq_len, or more data)")


@dataclass(frozen=True)
class TrainerWorkload(Workload):
    config: TrainerConfig
    #: ``stages: auto`` not split yet (launch splits it: :mod:`mlxops.jobs.stagesplit`);
    #: an explicit or split one is ``config.train.stages``.
    auto_stages: bool = False
    #: ``train.shard_optimizer: auto`` decided for the ranks (launch decides it:
    #: :mod:`mlxops.jobs.sharding`): the config holds true or false; a resume or restart
    #: decides again, over the hosts it runs on.
    auto_shard: bool = False

    kind = KIND
    what = "the bundled trainer"
    summary = "the bundled trainer"
    splits_batch = True
    reads_data = True
    exports = True

    @classmethod
    def parse(cls, path: Path, section: Any, *, data: DataSpec | None = None
              ) -> TrainerWorkload:
        cfg = parse_trainer(path, section)
        _corpus(path, cfg, section, data)
        stages = parse_stages(path, section.get("stages"), cfg.model.layers)
        return cls(with_stages(path, cfg, stages), auto_stages=stages == STAGES_AUTO)

    @property
    def one_rank_per_host(self) -> bool:  # type: ignore[override]
        """Pipeline stages: one rank per host, the hosts in ring order."""
        return self.auto_stages or self.config.train.stages is not None

    def to_record(self) -> dict[str, Any]:
        return (self.config.to_dict() | ({"stages": STAGES_AUTO} if self.auto_stages else {})
                | ({SHARD_AUTO_RECORD: True} if self.auto_shard else {}))

    @classmethod
    def from_record(cls, data: Any) -> TrainerWorkload:
        data = dict(data)
        auto = data.pop("stages", None) == STAGES_AUTO
        auto_shard = data.pop(SHARD_AUTO_RECORD, False) is True
        return cls(trainer_config.from_dict(data, f"job.{KIND}"), auto_stages=auto,
                   auto_shard=auto_shard)

    @property
    def total_steps(self) -> int | None:
        return self.config.train.steps

    @property
    def global_batch(self) -> int | None:
        return self.config.train.global_batch

    @property
    def patience(self) -> int:
        return self.config.train.patience

    def rank_config(self, balance: str | list[float]) -> TrainerConfig:
        """The config as its ranks get it: ``train.balance`` set. A copy."""
        config = copy.deepcopy(self.config)
        config.train.balance = balance
        return config

    def check_world(self, path: Path, hosts: str, balance: str | list[float],
                    world: int) -> None:
        stages = self.config.train.stages
        if (stages is not None or self.auto_stages) and balance != BALANCE_EQUAL:
            raise bad_input(path, "balance", f"splits the batch; the stages of {KIND}.stages "
                                             "each take the whole batch (leave balance: out)")
        if stages is not None and len(stages) != world:
            raise bad_input(path, f"{KIND}.stages", f"{stages} gives {len(stages)} hosts "
                                                    f"layers; the hosts {hosts!r} are {world} "
                                                    "(one stage per host)")
        if self.one_rank_per_host:
            return   # each stage takes the whole batch: nothing to divide
        try:
            trainer_config.check_world(self.rank_config(balance), world, where=KIND)
        except trainer_config.ConfigError as exc:
            raise bad_input(path, None, f"{problem(exc)}; the hosts {hosts!r} give {world} "
                                        "ranks (their mlxops_slots)") from None

    def rank_plan(self, node: NodePlacement) -> RankPlan:
        config = self.rank_config(node.balance).to_dict() | {"out": node.paths.run_dir}
        if node.data_dir is not None:     # the job's data: this node's copy of the shards
            config = rank_data(config, node.data_dir)
        return config_rank_plan(node, "mlxops.trainer", protocol.TRAINER_CONFIG, config)

    def planner(self, path: Path) -> Planner:
        return TrainerPlanner(self.config)

    def collectives(self, world: int) -> tuple[str, ...]:
        """A sharded optimizer (``train.shard_optimizer`` true or auto) rebuilds the
        weights with ``all_gather`` every step; pipeline stages (``trainer.stages``) pass
        activations and their gradients with ``send``/``recv``."""
        mode = self.config.train.shard_optimizer
        named = (SEND_RECV,) if self.one_rank_per_host else ()
        if world > 1 and (mode is True or mode == SHARD_AUTO):
            named += (ALL_GATHER,)
        return named if world > 1 else ()

    def spreads_checkpoints(self) -> bool:
        """Pipeline stages, and a sharded optimizer (true or auto: the ranks decide)."""
        mode = self.config.train.shard_optimizer
        return self.one_rank_per_host or mode is True or mode == SHARD_AUTO

    def stage_layers(self) -> list[int] | None:
        stages = self.config.train.stages
        return list(stages) if self.one_rank_per_host and stages is not None else None

    def pipeline(self) -> PipelineCosts | None:
        if not self.one_rank_per_host:
            return None
        from mlxops.trainer.plansearch import trainer_micro_batches
        from mlxops.trainer.stages import trainer_costs

        t = self.config.train
        micro = trainer_micro_batches(t.global_batch, t.micro_batch)[0]  # the whole batch
        accum = t.global_batch // micro
        return PipelineCosts(trainer_costs(self.config, micro, accum), accum, micro,
                             None if self.auto_stages else t.stages, f"{KIND}.stages")

    def with_split(self, layers: list[int]) -> TrainerWorkload:
        config = copy.deepcopy(self.config)
        config.train.stages = list(layers)
        return TrainerWorkload(config, auto_stages=self.auto_stages, auto_shard=self.auto_shard)

    def shard_auto(self) -> str | None:
        """``train.shard_optimizer: auto``, decided or not (decided again at every launch;
        pipeline stages shard nothing)."""
        auto = self.auto_shard or self.config.train.shard_optimizer == SHARD_AUTO
        if not auto or self.one_rank_per_host:
            return None
        return f"{KIND}.train.shard_optimizer"

    def with_shard(self, shard: bool) -> TrainerWorkload:
        config = copy.deepcopy(self.config)
        config.train.shard_optimizer = shard
        return TrainerWorkload(config, auto_stages=self.auto_stages, auto_shard=True)


#: Bytes per parameter in one checkpoint: fp32 weights (4) and AdamW's two moments (8).
CHECKPOINT_BYTES_PER_PARAM = 12


@dataclass(frozen=True)
class TrainerPlanner(Planner):
    """The trainer's own plan (:mod:`mlxops.trainer.plan`)."""

    config: TrainerConfig

    def memory(self, memory: int, world: int, *, ranks_per_node: int,
               per_rank: int | None = None, working_set: int | None = None) -> Any:
        """As the run will be: sharded with ``train.shard_optimizer: true``; with auto not
        decided yet (``mlxops check``, one node at a time), sharded where the unsharded
        plan does not fit this node (the job decides over all its nodes at launch:
        :mod:`mlxops.jobs.sharding`)."""
        from mlxops.trainer.plan import plan_memory

        mode = self.config.train.shard_optimizer
        kwargs = dict(ranks_per_node=ranks_per_node, per_rank=per_rank,
                      working_set=working_set)
        unsharded = plan_memory(self.config, memory, world, **kwargs)
        if world > 1 and (mode is True or (mode == SHARD_AUTO and not unsharded.fits)):
            return plan_memory(self.config, memory, world, shard=True, **kwargs)
        return unsharded

    def sharded(self, memory: int, world: int, *, ranks_per_node: int,
                per_rank: int | None = None, working_set: int | None = None) -> Any:
        from mlxops.trainer.plan import plan_memory

        return plan_memory(self.config, memory, world, ranks_per_node=ranks_per_node,
                           per_rank=per_rank, working_set=working_set, shard=True)

    def gathered_bytes(self, world: int) -> int:
        from mlxops.trainer.plan import sharded_terms

        return sharded_terms(self.config, world).gathered if world > 1 else 0

    def checkpoints(self) -> tuple[int, int]:
        from mlxops.trainer.plan import count_params

        train = self.config.train
        kept = train.keep + 1 if train.checkpoint_every else 1   # the last one
        return count_params(self.config) * CHECKPOINT_BYTES_PER_PARAM, kept

    def step_work(self, plan: Any) -> tuple[int, int]:
        return plan.micro_batch * plan.accumulation * self.config.model.seq_len, 4 * plan.params

    def attention(self, tokens: int) -> tuple[float, int]:
        from mlxops.trainer.plan import attended_keys, attention_flops_per_token

        model = self.config.model
        return (attention_flops_per_token(self.config) * tokens / 1e9,
                attended_keys(model.seq_len, model.window))
