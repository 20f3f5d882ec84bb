"""The trainer's config: one typed structure with defaults, file values and overrides.

Precedence: dataclass defaults < the config file (JSON, or YAML when PyYAML happens to be
importable) < ``--set section.key=value`` on the command line. The resolved config is saved
into every checkpoint; resume compares it with :data:`RESUME_KEYS`.

Standard library only: the controller imports this module to validate a job's ``trainer:``
section, and nodes import it without mlxops' own dependencies. So the rules live here once:
:func:`validate` (every value on its own) and :func:`check_world` (what needs the number of
ranks), which ``mlxops launch``/``plan`` apply before any rank starts and the trainer
applies again when it starts.

The file reader (JSON or YAML, a key written twice refused) is :mod:`.configfile`;
:class:`ConfigError` is defined there and re-exported here.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

from . import balance, sections
from .configfile import ConfigError
from .vocabulary import OPTIMIZERS, SCHEDULES, TrainKeys, default, upgrade
from .vocabulary import key_field as _f


@dataclass
class ModelConfig:
    dims: int = _f(256, "model width")
    layers: int = _f(4, "transformer blocks")
    heads: int = _f(4, "attention heads (dims must be divisible by heads)")
    vocab_size: int = _f(256, "vocabulary size; 256 = byte-level tokens")
    seq_len: int = _f(128, "tokens per training sequence")
    ffn_dims: int | None = _f(None, "SwiGLU hidden width; null = 8/3*dims rounded up to 8")
    rope_base: float = _f(10000.0, "RoPE base frequency")
    norm_eps: float = _f(1e-5, "RMSNorm epsilon")
    tie_embeddings: bool = _f(True, "share the input embedding with the output head")
    window: int = _f(0, "sliding-window attention: each token attends to itself and the "
                     "window-1 tokens before it; 0 = the whole sequence")

    def hidden(self) -> int:
        if self.ffn_dims:
            return self.ffn_dims
        return ((8 * self.dims // 3) + 7) // 8 * 8


@dataclass
class DataConfig:
    source: str = _f("synthetic", "synthetic | text | jsonl | shards")
    path: str | None = _f(None, "file or directory for text/jsonl (all *.txt / *.jsonl in it); "
                          "for shards the directory mlxops data prepare wrote")
    seed: int = _f(0, "seed of the sample order (and of the synthetic corpus)")
    text_field: str = _f("text", "JSONL field holding the document text")
    prefetch: int = _f(2, "steps of data read ahead on a background thread; 0 = read in "
                       "the step")


@dataclass
class TrainConfig(TrainKeys):
    """``train:``: the keys every program has (:class:`~.vocabulary.TrainKeys`, with the
    bundled trainer's defaults) and the trainer's own."""

    dtype: str = _f("float32", "compute dtype: float32 | bfloat16 (master weights stay fp32)")
    shard_optimizer: bool | str = _f(False, "AdamW's state (and bfloat16's float32 master "
                                     "weights) sharded over the ranks, ZeRO-1: true | false "
                                     "| auto (sharded when the memory plan does not fit "
                                     "unsharded on some rank); bitwise the same training")
    eval_every: int = default("eval_every", 0, "measure the validation loss every N steps "
                              "(and at the last); 0 = off; needs data.source shards (its "
                              "validation split) or synthetic")
    stages: list[int] | None = _f(None, "pipeline stages: layers per rank in rank order "
                                  "(docs/pipeline.md); null = data parallel")


@dataclass
class TrainerConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    out: str = _f("runs/default", "run directory: metrics.jsonl, progress/, ckpt/")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


SECTIONS = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig}
#: ``data.source``'s kinds, and those with validation data (train.eval_every).
SOURCES = ("synthetic", "text", "jsonl", "shards")
EVAL_SOURCES = ("synthetic", "shards")
#: The synthetic corpus gives every token this many distinct successors (trainer/data.py),
#: so its vocabulary needs at least as many tokens.
SYNTHETIC_SUCCESSORS = 4

# Keys that must be equal between a checkpoint and the config that resumes it: they change
# the model, the data stream or the optimisation trajectory. Everything else (steps,
# micro_batch, logging, checkpointing, dtype, grad_reduce_dtype, consistency_every,
# balance, grad_checkpoint, eval_every, eval_batches, patience, data.prefetch, out) may
# change on resume: the batch split changes only the order of summation.
RESUME_KEYS = (
    [f"model.{f.name}" for f in dataclasses.fields(ModelConfig)]
    + [f"data.{f.name}" for f in dataclasses.fields(DataConfig) if f.name != "prefetch"]
    + ["train.global_batch", "train.seed", "train.optimizer", "train.lr", "train.min_lr",
       "train.schedule", "train.warmup", "train.weight_decay", "train.grad_clip"]
)


def default_config() -> TrainerConfig:
    return TrainerConfig()


#: ``train.balance``'s modes (a job's ``balance:`` takes the same words): trainer/balance.py's.
BALANCE_EQUAL, BALANCE_AUTO = balance.EQUAL, balance.AUTO
BALANCE_MODES = (BALANCE_EQUAL, BALANCE_AUTO)


#: ``train.shard_optimizer``'s word besides true and false.
SHARD_AUTO = "auto"


def _coerce(where: str, key: str, typ: Any, value: Any) -> Any:
    """Check ``value`` against the annotated type; ints are accepted where floats are."""
    if typ == bool | str:  # train.shard_optimizer: true, false or auto
        if isinstance(value, bool) or value == SHARD_AUTO:
            return value
        if value in ("true", "false"):  # --set train.shard_optimizer=true
            return value == "true"
        raise ConfigError(f"{where}: {key}: must be true, false or auto, got {value!r}")
    if typ == list | str:  # train.balance: a mode, or one weight per rank
        if value in BALANCE_MODES:
            return value
        if isinstance(value, list) and value and all(
                isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w)
                and w > 0 for w in value):
            return [float(w) for w in value]
        raise ConfigError(f"{where}: {key}: must be equal, auto or a list of positive "
                          f"numbers (one per rank), got {value!r}")
    if typ == list[int] | None:  # train.stages: layers per rank
        if value is None or (isinstance(value, list) and value and all(
                isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in value)):
            return value
        raise ConfigError(f"{where}: {key}: must be a list of positive layer counts (one "
                          f"per rank) or null, got {value!r}")
    optional = False
    if typ in (int | None, str | None):
        optional = True
        typ = int if typ == int | None else str
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{where}: {key}: must not be null")
    if typ is bool:
        if isinstance(value, bool):
            return value
    elif typ is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise ConfigError(f"{where}: {key}: must be a finite number, got {value!r}")
            return float(value)
    elif typ is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif typ is str:
        if isinstance(value, str):
            return value
    raise ConfigError(f"{where}: {key}: expected {typ.__name__}, got {value!r}")


def from_dict(data: dict[str, Any], where: str = "config") -> TrainerConfig:
    """Build and validate a config from a nested mapping; unknown keys are an error."""
    cfg = TrainerConfig()
    sections.fill(cfg, SECTIONS, data, where, _coerce)
    validate(cfg, where)
    return cfg


def apply_overrides(cfg: TrainerConfig, overrides: list[str], where: str = "--set") -> None:
    """Apply ``section.key=value`` strings (the ``--set`` option) in place."""
    sections.override(cfg, SECTIONS, overrides, where, _coerce)
    validate(cfg, where)


def validate(cfg: TrainerConfig, where: str) -> None:
    m, d, t = cfg.model, cfg.data, cfg.train
    positive = {
        "model.dims": m.dims, "model.layers": m.layers, "model.heads": m.heads,
        "model.vocab_size": m.vocab_size, "model.seq_len": m.seq_len,
        "train.steps": t.steps, "train.global_batch": t.global_batch,
        "train.micro_batch": t.micro_batch, "train.keep": t.keep,
        "train.log_every": t.log_every,
    }
    for key, value in positive.items():
        if value <= 0:
            raise ConfigError(f"{where}: {key}: must be positive, got {value}")
    # Values the trainer would otherwise trip over only once it runs (a negative seed is
    # refused by numpy and mlx, a negative width by the layers) or train on silently wrong.
    if m.ffn_dims is not None and m.ffn_dims <= 0:
        raise ConfigError(f"{where}: model.ffn_dims: must be positive or null, got {m.ffn_dims}")
    for key, value in {"model.rope_base": m.rope_base, "model.norm_eps": m.norm_eps}.items():
        if value <= 0:
            raise ConfigError(f"{where}: {key}: must be positive, got {value}")
    for key, value in {"train.warmup": t.warmup, "train.min_lr": t.min_lr,
                       "train.weight_decay": t.weight_decay, "train.grad_clip": t.grad_clip,
                       "train.seed": t.seed, "data.seed": d.seed}.items():
        if value < 0:
            raise ConfigError(f"{where}: {key}: must be >= 0, got {value}")
    for key, value in {"train.seed": t.seed, "data.seed": d.seed}.items():
        if value >= 2**63:
            raise ConfigError(f"{where}: {key}: must be below 2**63, got {value}")
    if m.dims % m.heads or (m.dims // m.heads) % 2:
        raise ConfigError(f"{where}: model.heads: dims/heads must be an even integer")
    if t.stop_at < 0 or t.stop_at > t.steps:
        raise ConfigError(f"{where}: train.stop_at: must be between 0 and train.steps")
    if t.checkpoint_every < 0:
        raise ConfigError(f"{where}: train.checkpoint_every: must be >= 0")
    if t.consistency_every < 0:
        raise ConfigError(f"{where}: train.consistency_every: must be >= 0 (0 = off), got "
                          f"{t.consistency_every}")
    if t.lr <= 0:
        raise ConfigError(f"{where}: train.lr: must be positive")
    for key, (value, allowed) in {"train.optimizer": (t.optimizer, OPTIMIZERS),
                                  "train.schedule": (t.schedule, SCHEDULES)}.items():
        if value not in allowed:
            raise ConfigError(f"{where}: {key}: must be {' | '.join(allowed)}, got {value!r}")
    for key, value in {"train.dtype": t.dtype,
                       "train.grad_reduce_dtype": t.grad_reduce_dtype}.items():
        if value not in ("float32", "bfloat16"):
            raise ConfigError(f"{where}: {key}: must be float32 or bfloat16, got {value!r}")
    if d.source not in SOURCES:
        raise ConfigError(f"{where}: data.source: must be synthetic, text, jsonl or shards")
    if d.source != "synthetic" and not d.path:
        raise ConfigError(f"{where}: data.path: required for source {d.source}")
    if d.source in ("text", "jsonl") and m.vocab_size < 256:
        raise ConfigError(f"{where}: model.vocab_size: byte-level text needs >= 256")
    if d.source == "synthetic" and m.vocab_size < SYNTHETIC_SUCCESSORS:
        raise ConfigError(f"{where}: model.vocab_size: the synthetic corpus needs >= "
                          f"{SYNTHETIC_SUCCESSORS} tokens, got {m.vocab_size}")
    if d.source == "jsonl" and not d.text_field:
        raise ConfigError(f"{where}: data.text_field: must name the JSONL text field")
    for key, value in {"model.window": m.window, "data.prefetch": d.prefetch,
                       "train.eval_every": t.eval_every, "train.patience": t.patience}.items():
        if value < 0:
            raise ConfigError(f"{where}: {key}: must be >= 0 (0 = off), got {value}")
    if t.eval_batches <= 0:
        raise ConfigError(f"{where}: train.eval_batches: must be positive, got "
                          f"{t.eval_batches}")
    if t.eval_every and d.source not in EVAL_SOURCES:
        raise ConfigError(f"{where}: train.eval_every: validation needs data.source shards "
                          f"(the corpus's validation split) or synthetic, not {d.source}")
    if t.stages is not None:
        _validate_stages(cfg, where)
    if t.patience and not t.eval_every:
        raise ConfigError(f"{where}: train.patience: counts evaluations; set "
                          "train.eval_every too")


def _validate_stages(cfg: TrainerConfig, where: str) -> None:
    """``train.stages``: the layers of each stage, which must be the model's; what the
    pipeline does not do yet is refused here rather than at its first step."""
    t, layers = cfg.train, cfg.model.layers
    if sum(t.stages) != layers:
        raise ConfigError(f"{where}: train.stages: {t.stages} sums to {sum(t.stages)} "
                          f"layers; the model has {layers} (model.layers)")
    if t.balance != BALANCE_EQUAL:
        raise ConfigError(f"{where}: train.balance: {t.balance!r} splits the batch; pipeline "
                          "stages each take the whole batch (use equal)")
    if t.eval_every:
        raise ConfigError(f"{where}: train.eval_every: validation across pipeline stages is "
                          "not built yet (docs/pipeline.md); set 0")


def check_world(cfg: TrainerConfig, world: int, where: str = "config") -> None:
    """The rules that need the number of ranks, ``world``.

    With ``balance: equal`` every rank takes ``global_batch / world`` sequences of each
    step, so the global batch must divide evenly; otherwise each rank takes at least one,
    and a list of weights has one per rank. (``micro_batch`` is an upper bound: the
    trainer takes the largest divisor of the per-rank batch not above it, so it never
    conflicts with the world.) With ``train.stages`` each rank is a stage and takes the
    whole batch: one rank per stage.
    """
    if cfg.train.stages is not None:
        if len(cfg.train.stages) != world:
            raise ConfigError(f"{where}: train.stages: {len(cfg.train.stages)} stages need "
                              f"as many ranks, not {world}")
        return
    sections.check_world_size(cfg.train.global_batch, cfg.train.balance, world, where,
                              "sequence")


def load_config(
    source: str | os.PathLike[str] | dict[str, Any],
    overrides: list[str] | None = None,
    where: str | None = None,
) -> TrainerConfig:
    """Load a config from a file path or a mapping (a job's ``trainer:`` section).

    ``where`` names the origin in messages (e.g. ``"job.yml: trainer"``); it defaults to
    the path, or ``trainer`` for a mapping.

    Raises :class:`ConfigError` with a one-line message naming the file and the key.
    """
    data, where = sections.read_source(source, where, "trainer")
    cfg = from_dict(data, where)
    if overrides:
        apply_overrides(cfg, overrides)
    return cfg


def diff_resume_keys(saved: dict[str, Any], current: TrainerConfig) -> list[str]:
    """Keys of :data:`RESUME_KEYS` whose values differ: ``["model.dims: 64 != 128"]``."""
    return sections.diff_keys(RESUME_KEYS, upgrade(saved), current.to_dict(),
                              TrainerConfig().to_dict())


def describe_options() -> str:
    """Every config key with its default and meaning, for ``--help``."""
    lines = []
    for name, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else None
            lines.append(f"  {name}.{f.name:<18} {json.dumps(default):<10} {f.metadata['help']}")
    lines.append(f"  {'out':<24} {json.dumps('runs/default'):<10} "
                 + TrainerConfig.__dataclass_fields__["out"].metadata["help"])
    return "\n".join(lines)


#: The value rule, public for the fine-tuning config (mlxops/finetune/config.py), which
#: follows it key for key (and the section rules of :mod:`.sections`).
coerce = _coerce
