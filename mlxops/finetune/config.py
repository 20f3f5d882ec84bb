"""The fine-tuning config: one typed structure with defaults, file values and overrides.

The same shape and rules as the bundled trainer's (:mod:`mlxops.trainer.config`):
dataclass defaults < the config file (JSON, or YAML when PyYAML is importable) < ``--set
section.key=value``; unknown keys, keys written twice, wrong types and out-of-range values
are a :class:`ConfigError` naming the file and the key (exit 2). The controller parses a
job's ``finetune:`` section with :func:`load_config` before it connects to any host, and
the node program parses the resolved copy again when it starts.

Standard library only (the controller imports it; nodes run it without mlxops' own
dependencies). The names follow mlx-lm's where it has one (``num_layers``, ``rank``,
``scale``, ``dropout``, ``keys``, ``mask_prompt``, ``max_seq_len`` for its
``max_seq_length``), so that an ``adapter_config.json`` mlxops writes reads as mlx-lm's.

Batch: each step takes ``train.global_batch`` examples over all ranks; rank r takes a
contiguous slice of ``c_r`` of them (``train.balance``, :mod:`mlxops.trainer.balance`) and
cuts it into ``ceil(c_r / train.micro_batch)`` micro-batches (the out-of-memory back-off
halves ``micro_batch``). The loss is the mean over every unmasked token of the global
batch, whatever the split, so the world size, the balance and the micro-batches change
only the order of summation.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any

from mlxops.trainer import sections
from mlxops.trainer.config import ConfigError, coerce
from mlxops.trainer.vocabulary import OPTIMIZERS, SCHEDULES, TrainKeys, default, upgrade
from mlxops.trainer.vocabulary import key_field as _f

__all__ = ["ConfigError", "FinetuneConfig", "load_config", "check_world", "describe_options",
           "diff_resume_keys", "METHODS", "OPTIMIZERS", "SCHEDULES"]

METHODS = ("lora", "dora", "full")


@dataclass
class ModelSection:
    path: str | None = _f(None, "the base model: a directory in the Hugging Face / mlx-lm "
                          "layout (config.json, *.safetensors, tokenizer files; quantized "
                          "models too); required")


@dataclass
class MethodSection:
    type: str = _f("lora", "lora, dora or full")
    rank: int = _f(8, "LoRA/DoRA rank")
    scale: float = _f(20.0, "LoRA/DoRA scale (mlx-lm's; the update is scale x B A x)")
    dropout: float = _f(0.0, "dropout on the adapter's input, 0 <= dropout < 1")
    num_layers: int = _f(16, "adapt (or, for full, train) the last N transformer blocks; "
                         "-1 = all")
    keys: list | None = _f(None, "module paths inside each block to adapt, e.g. "
                           "[self_attn.q_proj, self_attn.v_proj]; null = every linear "
                           "layer (mlx-lm's default)")


@dataclass
class DataSection:
    path: str | None = _f(None, "directory holding train.jsonl and valid.jsonl in mlx-lm's "
                          "formats (chat messages, prompt/completion or text); required")
    mask_prompt: bool = _f(False, "leave the prompt out of the loss (chat and completions "
                           "data: only the last message / the completion is learnt)")


@dataclass
class TrainSection(TrainKeys):
    """``train:``: the keys every program has (:class:`mlxops.trainer.vocabulary.TrainKeys`,
    one meaning each) with fine-tuning's defaults, and fine-tuning's own."""

    global_batch: int = default("global_batch", 4)
    micro_batch: int = default("micro_batch", 4)
    lr: float = default("lr", 1e-5)
    schedule: str = default("schedule", "constant")
    eval_every: int = default("eval_every", 100)
    eval_batches: int = default("eval_batches", 25, "global batches of validation data per "
                                "evaluation; -1 = all of valid.jsonl")
    epochs: int = _f(0, "when above 0: train this many passes over train.jsonl instead "
                     "of train.steps (epochs x its full global batches)")
    max_seq_len: int = _f(2048, "tokens per example at most (longer ones are cut)")
    stages: list[int] | None = _f(None, "pipeline stages: blocks per rank in rank order "
                                  "(docs/pipeline.md); null = data parallel")


@dataclass
class FinetuneConfig:
    model: ModelSection = field(default_factory=ModelSection)
    method: MethodSection = field(default_factory=MethodSection)
    data: DataSection = field(default_factory=DataSection)
    train: TrainSection = field(default_factory=TrainSection)
    out: str = _f("runs/finetune", "run directory: metrics.jsonl, progress/, ckpt/ and best/ "
                  "(each checkpoint holds its adapters in mlx-lm's format)")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


SECTIONS = {"model": ModelSection, "method": MethodSection, "data": DataSection,
            "train": TrainSection}

# Keys that must be equal between a checkpoint and the config that resumes it: they change
# the trainable weights, the data stream or the optimisation. The model and data paths may
# move (another node root); their content is the job's business (hash-checked placement).
RESUME_KEYS = (
    [f"method.{f.name}" for f in dataclasses.fields(MethodSection)]
    + ["data.mask_prompt"]
    + [f"train.{name}" for name in ("optimizer", "lr", "min_lr", "schedule", "warmup",
                                     "weight_decay", "grad_clip")]
    + ["train.global_batch", "train.max_seq_len", "train.seed", "train.epochs"]
)


def _coerce(where: str, key: str, typ: Any, value: Any) -> Any:
    if typ == list | None:  # method.keys: null, or a list of module paths
        if value is None:
            return None
        if isinstance(value, list) and value and all(isinstance(k, str) and k for k in value):
            return list(value)
        raise ConfigError(f"{where}: {key}: must be null or a list of module paths, "
                          f"got {value!r}")
    return coerce(where, key, typ, value)


def from_dict(data: dict[str, Any], where: str = "finetune") -> FinetuneConfig:
    """Build and validate a config from a nested mapping; unknown keys are an error."""
    cfg = FinetuneConfig()
    sections.fill(cfg, SECTIONS, data, where, _coerce)
    validate(cfg, where)
    return cfg


def apply_overrides(cfg: FinetuneConfig, overrides: list[str], where: str = "--set") -> None:
    """Apply ``section.key=value`` strings (the ``--set`` option) in place."""
    sections.override(cfg, SECTIONS, overrides, where, _coerce)
    validate(cfg, where)


def validate(cfg: FinetuneConfig, where: str) -> None:
    """Every value on its own (what needs the world size: :func:`check_world`)."""
    m, d, t = cfg.method, cfg.data, cfg.train
    if not cfg.model.path:
        raise ConfigError(f"{where}: model.path: required (the base model's directory)")
    if not d.path:
        raise ConfigError(f"{where}: data.path: required (a directory with train.jsonl)")
    choices = {"method.type": (m.type, METHODS), "train.optimizer": (t.optimizer, OPTIMIZERS),
               "train.schedule": (t.schedule, SCHEDULES),
               "train.grad_reduce_dtype": (t.grad_reduce_dtype, ("float32", "bfloat16"))}
    for key, (value, allowed) in choices.items():
        if value not in allowed:
            raise ConfigError(f"{where}: {key}: must be {' | '.join(allowed)}, got {value!r}")
    positive = {"method.rank": m.rank, "train.steps": t.steps,
                "train.global_batch": t.global_batch, "train.micro_batch": t.micro_batch,
                "train.max_seq_len": t.max_seq_len, "train.log_every": t.log_every,
                "train.keep": t.keep, "train.lr": t.lr}
    for key, value in positive.items():
        if value <= 0:
            raise ConfigError(f"{where}: {key}: must be positive, got {value}")
    at_least_zero = {"method.scale": m.scale, "train.min_lr": t.min_lr,
                     "train.warmup": t.warmup, "train.weight_decay": t.weight_decay,
                     "train.grad_clip": t.grad_clip, "train.epochs": t.epochs,
                     "train.seed": t.seed, "train.eval_every": t.eval_every,
                     "train.checkpoint_every": t.checkpoint_every, "train.patience": t.patience,
                     "train.consistency_every": t.consistency_every}
    for key, value in at_least_zero.items():
        if value < 0:
            raise ConfigError(f"{where}: {key}: must be >= 0, got {value}")
    if t.seed >= 2**63:
        raise ConfigError(f"{where}: train.seed: must be below 2**63, got {t.seed}")
    if not 0.0 <= m.dropout < 1.0:
        raise ConfigError(f"{where}: method.dropout: must be in [0, 1), got {m.dropout}")
    if m.num_layers == 0 or m.num_layers < -1:
        raise ConfigError(f"{where}: method.num_layers: must be positive or -1 (all), got "
                          f"{m.num_layers}")
    if t.eval_batches == 0 or t.eval_batches < -1:
        raise ConfigError(f"{where}: train.eval_batches: must be positive or -1 (all), got "
                          f"{t.eval_batches}")
    if t.stop_at < 0 or (not t.epochs and t.stop_at > t.steps):
        raise ConfigError(f"{where}: train.stop_at: must be between 0 and train.steps")
    if t.patience and not t.eval_every:
        raise ConfigError(f"{where}: train.patience: needs train.eval_every (patience counts "
                          "validations)")
    if t.stages is not None:
        _validate_stages(cfg, where)
    if m.type == "full" and m.keys is not None:
        raise ConfigError(f"{where}: method.keys: goes with lora or dora (full trains whole "
                          "blocks)")


def _validate_stages(cfg: FinetuneConfig, where: str) -> None:
    """``train.stages``: what the pipeline does not do is refused here rather than at its
    first step (the blocks' sum against the model: the job's load and the stage's build,
    which read its config.json)."""
    t = cfg.train
    if t.balance != "equal":
        raise ConfigError(f"{where}: train.balance: {t.balance!r} splits the batch; pipeline "
                          "stages each take the whole batch (use equal)")
    if t.eval_every:
        raise ConfigError(f"{where}: train.eval_every: validation across pipeline stages is "
                          "not built yet (docs/pipeline.md); set 0")


def check_world(cfg: FinetuneConfig, world: int, where: str = "finetune") -> None:
    """The rules that need the number of ranks: every rank takes at least one example of
    each global batch, ``equal`` needs a global batch that divides, and a list of weights
    has one per rank (the trainer's rule, :func:`mlxops.trainer.config.check_world`).
    With ``train.stages`` each rank is a stage and takes the whole batch: one rank per
    stage."""
    if cfg.train.stages is not None:
        if len(cfg.train.stages) != world:
            raise ConfigError(f"{where}: train.stages: {len(cfg.train.stages)} stages need "
                              f"as many ranks, not {world}")
        return
    sections.check_world_size(cfg.train.global_batch, cfg.train.balance, world, where,
                              "example")


def load_config(source: str | os.PathLike[str] | dict[str, Any],
                overrides: list[str] | None = None, where: str | None = None
                ) -> FinetuneConfig:
    """A config from a file path or a mapping (a job's ``finetune:`` section); ``where``
    names the origin in messages (default: the path, or ``finetune``)."""
    data, where = sections.read_source(source, where, "finetune")
    cfg = from_dict(data, where)
    if overrides:
        apply_overrides(cfg, overrides)
    return cfg


def diff_resume_keys(saved: dict[str, Any], current: FinetuneConfig) -> list[str]:
    """Keys of :data:`RESUME_KEYS` whose values differ: ``["method.rank: ..."]``."""
    return sections.diff_keys(RESUME_KEYS, upgrade(saved), current.to_dict(),
                              FinetuneConfig().to_dict())


def options() -> list[tuple[str, Any, str]]:
    """Every key as ``(name, default, meaning)``, in order: ``--help`` and the docs."""
    rows = []
    for name, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            rows.append((f"{name}.{f.name}", default, f.metadata["help"]))
    out = FinetuneConfig.__dataclass_fields__["out"]
    rows.append(("out", out.default, out.metadata["help"]))
    return rows


def describe_options() -> str:
    """Every config key with its default and meaning, for ``--help``."""
    return "\n".join(f"  {name:<26} {json.dumps(default):<10} {help}"
                     for name, default, help in options())
