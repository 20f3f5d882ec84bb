"""The trainer's config: one typed structure with defaults, file values and overrides.

Precedence: dataclass defaults < the config file (JSON, or YAML when PyYAML happens to be
importable) < ``--set section.key=value`` on the command line. The resolved config is saved
into every checkpoint; resume compares it with :data:`RESUME_KEYS`.

Standard library only: the controller imports this module to validate a job's ``trainer:``
section, and nodes import it without mlxops' own dependencies. So the rules live here once:
:func:`validate` (every value on its own) and :func:`check_world` (what needs the number of
ranks), which ``mlxops launch``/``plan`` apply before any rank starts and the trainer
applies again when it starts.

The file reader is the trainer's own (the controller's, ``mlxops.yamlfile``, is not synced
to nodes) with the same rules and wording: a key written twice is refused, ``FILE: KEY:
duplicate key``, where JSON and PyYAML would silently keep the last one.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_type_hints

from . import balance


class ConfigError(ValueError):
    """An invalid config: a one-line message naming the file and the key. Exit code 2."""

    exit_code = 2


def _f(default: Any, help: str) -> Any:
    """A dataclass field whose help text ends up in ``--help``."""
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


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

    def hidden(self) -> int:
        if self.ffn_dims:
            return self.ffn_dims
        return ((8 * self.dims // 3) + 7) // 8 * 8


@dataclass
class DataConfig:
    source: str = _f("synthetic", "synthetic | text | jsonl")
    path: str | None = _f(None, "file or directory for text/jsonl (all *.txt / *.jsonl in it)")
    seed: int = _f(0, "seed of the sample order (and of the synthetic corpus)")
    text_field: str = _f("text", "JSONL field holding the document text")


@dataclass
class TrainConfig:
    steps: int = _f(1000, "optimizer steps in total (the learning-rate schedule spans them)")
    stop_at: int = _f(0, "stop after this step, leaving the run resumable; 0 = train.steps")
    global_batch: int = _f(32, "sequences per optimizer step, over all ranks")
    micro_batch: int = _f(8, "sequences per rank per forward/backward (upper bound)")
    lr: float = _f(3e-4, "peak learning rate (AdamW)")
    min_lr: float = _f(0.0, "learning rate at the end of the cosine decay")
    warmup: int = _f(0, "linear warmup steps")
    weight_decay: float = _f(0.0, "AdamW weight decay")
    grad_clip: float = _f(0.0, "clip the global gradient norm to this; 0 = off")
    seed: int = _f(0, "seed of the model initialisation")
    checkpoint_every: int = _f(100, "write a checkpoint every N steps (and at the end); 0 = off")
    keep: int = _f(3, "keep the last K checkpoints")
    log_every: int = _f(10, "print and write metrics every N steps")
    grad_checkpoint: bool = _f(False, "recompute each layer in backward (mx.checkpoint)")
    dtype: str = _f("float32", "compute dtype: float32 | bfloat16 (master weights stay fp32)")
    grad_reduce_dtype: str = _f("float32", "gradients on the network in the all-reduce: "
                                "float32 | bfloat16 (half the bytes; summed across ranks in "
                                "bfloat16, everything else float32)")
    consistency_every: int = _f(100, "every N steps the ranks compare a checksum of their "
                                "parameters and optimizer state; on a mismatch rank 0's copy "
                                "is sent to all; 0 = off")
    balance: list | str = _f("equal", "how the global batch is split over ranks: equal | "
                             "auto (measured in the first steps) | a list of weights, one "
                             "per rank (relative speeds); gradients weighted by sample count")


@dataclass
class TrainerConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    out: str = _f("runs/default", "run directory: metrics.jsonl, progress/, ckpt/")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


SECTIONS = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig}
#: The synthetic corpus gives every token this many distinct successors (trainer/data.py),
#: so its vocabulary needs at least as many tokens.
SYNTHETIC_SUCCESSORS = 4

# Keys that must be equal between a checkpoint and the config that resumes it: they change
# the model, the data stream or the optimisation trajectory. Everything else (steps,
# micro_batch, logging, checkpointing, dtype, grad_reduce_dtype, consistency_every,
# balance, grad_checkpoint, out) may change on resume: the batch split changes only the
# order of summation.
RESUME_KEYS = (
    [f"model.{f.name}" for f in dataclasses.fields(ModelConfig)]
    + [f"data.{f.name}" for f in dataclasses.fields(DataConfig)]
    + ["train.global_batch", "train.seed", "train.lr", "train.min_lr", "train.warmup",
       "train.weight_decay", "train.grad_clip"]
)


def default_config() -> TrainerConfig:
    return TrainerConfig()


#: ``train.balance``'s modes (a job's ``balance:`` takes the same words): trainer/balance.py's.
BALANCE_EQUAL, BALANCE_AUTO = balance.EQUAL, balance.AUTO
BALANCE_MODES = (BALANCE_EQUAL, BALANCE_AUTO)


def _coerce(where: str, key: str, typ: Any, value: Any) -> Any:
    """Check ``value`` against the annotated type; ints are accepted where floats are."""
    if typ == list | str:  # train.balance: a mode, or one weight per rank
        if value in BALANCE_MODES:
            return value
        if isinstance(value, list) and value and all(
                isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w)
                and w > 0 for w in value):
            return [float(w) for w in value]
        raise ConfigError(f"{where}: {key}: must be equal, auto or a list of positive "
                          f"numbers (one per rank), got {value!r}")
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


def _parse_scalar(text: str) -> Any:
    """A command-line value: JSON if it parses (numbers, true, null, "..."), else a string."""
    try:
        return json.loads(text)
    except ValueError:
        return text


class _Pairs(list):
    """A JSON object as its (key, value) pairs in file order, so duplicates can be seen."""


def _unique_keys(value: Any, path: Path, key: str | None = None) -> Any:
    """JSON data with its objects made dicts; a key twice in one object is refused."""
    if isinstance(value, _Pairs):
        out: dict[str, Any] = {}
        for name, item in value:
            where = f"{key}.{name}" if key else name
            if name in out:
                raise ConfigError(f"{path}: {where}: duplicate key")
            out[name] = _unique_keys(item, path, where)
        return out
    if isinstance(value, list):
        return [_unique_keys(item, path, f"{key or ''}[{i}]") for i, item in enumerate(value)]
    return value


def _read_json(text: str, path: Path) -> Any:
    try:
        data = json.loads(text, object_pairs_hook=_Pairs)
    except ValueError as e:
        raise ConfigError(f"{path}: invalid JSON: {e}") from None
    return _unique_keys(data, path)


def _read_yaml(text: str, path: Path) -> Any:
    try:
        import yaml  # optional: nodes may not have PyYAML; mlxops writes JSON
    except ImportError:
        raise ConfigError(f"{path}: YAML needs PyYAML; use a JSON config") from None
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _refuse_duplicate_keys(yaml, loader, node, path, None)
        return loader.construct_document(node)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{path}: {where}invalid YAML: {problem}") from None
    finally:
        loader.dispose()


def _refuse_duplicate_keys(yaml: Any, loader: Any, node: Any, path: Path, key: str | None
                           ) -> None:
    """Keys written twice in one mapping, over the node tree as written. Merge keys
    (``<<: *base``) are not duplicates: the mapping's own keys override merged ones."""
    if isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _refuse_duplicate_keys(yaml, loader, item, path, f"{key or ''}[{i}]")
    elif isinstance(node, yaml.MappingNode):
        first: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            name = loader.construct_object(key_node, deep=True)
            where = f"{key}.{name}" if key else str(name)
            if not isinstance(name, (str, int, float, bool)):
                continue  # an unhashable key: construction reports it
            if name in first:
                raise ConfigError(f"{path}: {where}: duplicate key at line "
                                  f"{key_node.start_mark.line + 1} (first at line "
                                  f"{first[name].start_mark.line + 1})")
            first[name] = key_node
            _refuse_duplicate_keys(yaml, loader, value_node, path, where)


def _read_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from None
    if path.suffix in (".yml", ".yaml"):
        data = _read_yaml(text, path)
    else:
        data = _read_json(text, path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the config must be a mapping")
    return data


def from_dict(data: dict[str, Any], where: str = "config") -> TrainerConfig:
    """Build and validate a config from a nested mapping; unknown keys are an error."""
    cfg = TrainerConfig()
    for key, value in data.items():
        if key == "out":
            cfg.out = _coerce(where, "out", str, value)
            continue
        if key not in SECTIONS:
            raise ConfigError(f"{where}: {key}: unknown key")
        if value is None:
            continue
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: {key}: must be a mapping")
        section = getattr(cfg, key)
        hints = get_type_hints(type(section))
        for sub, v in value.items():
            if sub not in hints:
                raise ConfigError(f"{where}: {key}.{sub}: unknown key")
            setattr(section, sub, _coerce(where, f"{key}.{sub}", hints[sub], v))
    validate(cfg, where)
    return cfg


def apply_overrides(cfg: TrainerConfig, overrides: list[str], where: str = "--set") -> None:
    """Apply ``section.key=value`` strings (the ``--set`` option) in place."""
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep:
            raise ConfigError(f"{where}: {item}: expected section.key=value")
        value = _parse_scalar(text)
        if key == "out":
            cfg.out = _coerce(where, key, str, text)
            continue
        section_name, _, sub = key.partition(".")
        if section_name not in SECTIONS:
            raise ConfigError(f"{where}: {key}: unknown key")
        section = getattr(cfg, section_name)
        hints = get_type_hints(type(section))
        if sub not in hints:
            raise ConfigError(f"{where}: {key}: unknown key")
        if hints[sub] in (str, str | None) and value is not None:
            value = text  # keep "007" or "1e3" as strings where a string is expected
        setattr(section, sub, _coerce(where, key, hints[sub], value))
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
    for key, value in {"train.dtype": t.dtype,
                       "train.grad_reduce_dtype": t.grad_reduce_dtype}.items():
        if value not in ("float32", "bfloat16"):
            raise ConfigError(f"{where}: {key}: must be float32 or bfloat16, got {value!r}")
    if d.source not in ("synthetic", "text", "jsonl"):
        raise ConfigError(f"{where}: data.source: must be synthetic, text or jsonl")
    if d.source != "synthetic" and not d.path:
        raise ConfigError(f"{where}: data.path: required for source {d.source}")
    if d.source != "synthetic" and m.vocab_size < 256:
        raise ConfigError(f"{where}: model.vocab_size: byte-level text needs >= 256")
    if d.source == "synthetic" and m.vocab_size < SYNTHETIC_SUCCESSORS:
        raise ConfigError(f"{where}: model.vocab_size: the synthetic corpus needs >= "
                          f"{SYNTHETIC_SUCCESSORS} tokens, got {m.vocab_size}")
    if d.source == "jsonl" and not d.text_field:
        raise ConfigError(f"{where}: data.text_field: must name the JSONL text field")


def check_world(cfg: TrainerConfig, world: int, where: str = "config") -> None:
    """The rules that need the number of ranks, ``world``.

    With ``balance: equal`` every rank takes ``global_batch / world`` sequences of each
    step, so the global batch must divide evenly; otherwise each rank takes at least one,
    and a list of weights has one per rank. (``micro_batch`` is an upper bound: the
    trainer takes the largest divisor of the per-rank batch not above it, so it never
    conflicts with the world.)
    """
    if world < 1:
        raise ConfigError(f"{where}: the world size must be at least 1, got {world}")
    g, balance = cfg.train.global_batch, cfg.train.balance
    if isinstance(balance, list) and len(balance) != world:
        raise ConfigError(f"{where}: train.balance: {len(balance)} weights for {world} ranks "
                          "(one weight per rank)")
    if balance == BALANCE_EQUAL and g % world:
        raise ConfigError(f"{where}: train.global_batch: {g} is not divisible by the world "
                          f"size {world} (each rank takes global_batch / world sequences)")
    if g < world:
        raise ConfigError(f"{where}: train.global_batch: {g} is smaller than the world size "
                          f"{world} (every rank takes at least one sequence)")


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
    if isinstance(source, dict):
        cfg = from_dict(source, where or "trainer")
    else:
        path = Path(source)
        cfg = from_dict(_read_file(path), where or str(path))
    if overrides:
        apply_overrides(cfg, overrides)
    return cfg


def diff_resume_keys(saved: dict[str, Any], current: TrainerConfig) -> list[str]:
    """Keys of :data:`RESUME_KEYS` whose values differ: ``["model.dims: 64 != 128"]``."""
    now = current.to_dict()
    out = []
    for key in RESUME_KEYS:
        section, sub = key.split(".")
        a = saved.get(section, {}).get(sub)
        b = now[section][sub]
        if a != b:
            out.append(f"{key}: checkpoint has {a!r}, config has {b!r}")
    return out


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


#: The value and file rules, public for the fine-tuning config (mlxops/finetune/config.py),
#: which follows them key for key.
coerce, read_file = _coerce, _read_file
