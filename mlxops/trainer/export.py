"""A bundled-trainer checkpoint in mlx-lm's layout, so ``mlx_lm.load``/``generate``/``server``
read it: ``config.json``, ``model.safetensors`` (+ its index), ``tokenizer.json`` and
``tokenizer_config.json``.

The bundled model (:mod:`mlxops.trainer.model`) is mlx-lm's ``llama`` up to names:
pre-norm blocks of RMSNorm, attention with non-traditional RoPE (base ``rope_base``,
scale ``head_dim ** -0.5``, causal), RMSNorm, SwiGLU ``down(silu(gate(x)) * up(x))``, a
final RMSNorm and a head that is the embedding (``tie_embeddings``) or its own matrix.
The one difference in form is the fused ``qkv`` projection: its output is ``[q | k | v]``
along the features (``mx.split(qkv(x), 3, axis=-1)``), so its weight's rows ``[0, d)``,
``[d, 2d)``, ``[2d, 3d)`` are exactly ``q_proj``, ``k_proj``, ``v_proj``. Nothing is
approximated: the same weights in float32 give the same logits up to summation order.

``arch="qwen2"`` writes the same function as mlx-lm's ``qwen2`` (its q/k/v projections
have biases: written as zeros). mlx-lm can split a ``qwen2`` over several Macs by layers
(``--pipeline``); its ``llama`` only by tensor parallelism.

Tokens: the bundled trainer reads text as bytes, token ``i`` = byte ``i``. The tokenizer
written is a byte-level BPE with no merges whose token ``i`` is GPT-2's printable stand-in
for byte ``i`` (``bytes_to_unicode``), so every string encodes to its UTF-8 bytes and back.
Ids from 256 up (a vocabulary wider than bytes) are special tokens ``<|extra_N|>``. A
vocabulary under 256 cannot hold bytes: such a run (synthetic tokens) is refused.

A fine-tuning run's checkpoint (mlxops/finetune: it holds mlx-lm adapters,
``adapter_config.json``, beside the trainer's files) is not converted but fused:
``python -m mlx_lm fuse --model <its base model> --adapter-path <the checkpoint>
--save-path OUT`` (the base model is the run's ``model.path``, as the checkpoint's config
says), which a server spread over several Macs needs (mlx-lm refuses adapters there) and
one Mac serves as well.

Standard library and mlx only (mlx-lm, for a fuse, in a process of its own): it runs where
the checkpoint is (a node: ``python -m mlxops.trainer.export``) as well as on the
controller.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import mlx.core as mx

from mlxops.node.protocol import BEST_DIR, CKPT_DIR, CKPT_MODEL, CKPT_STATE, checkpoint_name
from mlxops.node.protocol.parts import STAGE_DIR
from mlxops.node.protocol.serve import EXPORT_ARCHES, ExportAnswer, export_parser

from .checkpoint import find_latest
from .config import ConfigError, ModelConfig, from_dict

ARCHES = EXPORT_ARCHES
DEFAULT_ARCH = ARCHES[0]
BYTES = 256
WEIGHTS = "model.safetensors"
#: What mlx-lm writes beside adapters, and so a fine-tuning checkpoint holds.
ADAPTER_CONFIG = "adapter_config.json"
WEIGHTS_INDEX = "model.safetensors.index.json"


class ExportError(ValueError):
    """A checkpoint that cannot be exported: one line, exit 2."""

    exit_code = 2


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map of the 256 bytes to printable characters (what a ByteLevel
    pre-tokenizer turns bytes into): printable Latin-1 maps to itself, the rest to
    ``chr(256 + n)`` in byte order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    out, extra = {}, 0
    for b in range(BYTES):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(BYTES + extra)
            extra += 1
    return out


def tokenizer_files(vocab_size: int) -> dict[str, Any]:
    """``tokenizer.json`` and ``tokenizer_config.json`` of the byte-level tokenizer."""
    if vocab_size < BYTES:
        raise ExportError(f"model.vocab_size is {vocab_size}: a byte-level tokenizer needs at "
                          f"least {BYTES} tokens (a run on synthetic tokens has no text to "
                          "export a tokenizer for)")
    chars = bytes_to_unicode()
    extras = [{"id": i, "content": f"<|extra_{i}|>", "single_word": False, "lstrip": False,
               "rstrip": False, "normalized": False, "special": True}
              for i in range(BYTES, vocab_size)]
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": extras,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                          "use_regex": False},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                    "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {chars[b]: b for b in range(BYTES)}, "merges": []},
    }
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1 << 20,
              "clean_up_tokenization_spaces": False, "add_bos_token": False,
              "add_eos_token": False}
    return {"tokenizer.json": tokenizer, "tokenizer_config.json": config}


def model_config(model: ModelConfig, arch: str = DEFAULT_ARCH) -> dict[str, Any]:
    """mlx-lm's ``config.json`` for the bundled model (see the module doc for the map)."""
    if arch not in ARCHES:
        raise ExportError(f"arch: must be one of {', '.join(ARCHES)}, got {arch!r}")
    return {
        "model_type": arch,
        "architectures": ["LlamaForCausalLM" if arch == "llama" else "Qwen2ForCausalLM"],
        "hidden_size": model.dims,
        "num_hidden_layers": model.layers,
        "intermediate_size": model.hidden(),
        "num_attention_heads": model.heads,
        "num_key_value_heads": model.heads,
        "head_dim": model.dims // model.heads,
        "rms_norm_eps": model.norm_eps,
        "vocab_size": model.vocab_size,
        "rope_theta": model.rope_base,
        "rope_traditional": False,
        "max_position_embeddings": model.seq_len,
        "tie_word_embeddings": model.tie_embeddings,
        "torch_dtype": "float32",
    }


def convert_weights(weights: dict[str, mx.array], model: ModelConfig,
                    arch: str = DEFAULT_ARCH) -> dict[str, mx.array]:
    """The bundled model's parameters under mlx-lm's names (``qkv`` split in three)."""
    d = model.dims
    out: dict[str, mx.array] = {"model.embed_tokens.weight": weights["embed.weight"],
                                "model.norm.weight": weights["norm.weight"]}
    if not model.tie_embeddings:
        out["lm_head.weight"] = weights["head.weight"]
    names = {"attn_norm.weight": "input_layernorm.weight",
             "mlp_norm.weight": "post_attention_layernorm.weight",
             "attn.out.weight": "self_attn.o_proj.weight",
             "mlp.gate.weight": "mlp.gate_proj.weight",
             "mlp.up.weight": "mlp.up_proj.weight",
             "mlp.down.weight": "mlp.down_proj.weight"}
    for i in range(model.layers):
        ours, theirs = f"blocks.{i}.", f"model.layers.{i}."
        for src, dst in names.items():
            out[theirs + dst] = weights[ours + src]
        qkv = weights[ours + "attn.qkv.weight"]
        for n, part in enumerate(("q_proj", "k_proj", "v_proj")):
            out[f"{theirs}self_attn.{part}.weight"] = qkv[n * d:(n + 1) * d]
            if arch == "qwen2":
                out[f"{theirs}self_attn.{part}.bias"] = mx.zeros((d,), dtype=qkv.dtype)
    missing = set(weights) - {"head.weight"} - _consumed(model)
    if missing:
        raise ExportError(f"the checkpoint has parameters this export does not know: "
                          f"{', '.join(sorted(missing)[:3])}")
    return out


def _consumed(model: ModelConfig) -> set[str]:
    per_block = ("attn_norm.weight", "mlp_norm.weight", "attn.out.weight", "attn.qkv.weight",
                 "mlp.gate.weight", "mlp.up.weight", "mlp.down.weight")
    return {"embed.weight", "norm.weight",
            *(f"blocks.{i}.{name}" for i in range(model.layers) for name in per_block)}


def find_checkpoint(run_dir: Path, step: int | None = None, best: bool = False) -> Path:
    """The run's checkpoint of ``step``, its best (``best/``: the lowest validation loss,
    kept by validation), or its newest complete one."""
    if best:
        path = find_latest(run_dir / BEST_DIR)
        if path is None:
            raise ExportError(f"{run_dir}: no best checkpoint (best/ is kept by a run with "
                              "validation)")
        return path
    ckpt_dir = run_dir / CKPT_DIR
    if (ckpt_dir / STAGE_DIR.format(index=0)).is_dir():
        return stage_checkpoint(ckpt_dir, step)
    if step is not None:
        path = ckpt_dir / checkpoint_name(step)
        if not (path / CKPT_MODEL).is_file():
            raise ExportError(f"{run_dir}: no checkpoint of step {step}")
        return path
    path = find_latest(ckpt_dir)
    if path is None:
        raise ExportError(f"{run_dir}: no complete checkpoint to export")
    return path


def stage_checkpoint(ckpt_dir: Path, step: int | None = None) -> Path:
    """A pipeline run's checkpoint of ``step`` (its newest when None) for which every
    stage's ``stage-<s>/step-<n>/`` is on this node (``mlxops export`` copies them here
    first); stage 0's directory is returned, :func:`stage_weights` merges them all."""
    steps = sorted({p.name for p in ckpt_dir.glob(STAGE_DIR.format(index="*") + "/step-*")
                    if p.is_dir()}, reverse=True)
    if step is not None:
        steps = [checkpoint_name(step)] if checkpoint_name(step) in steps else []
    first_missing = ""
    for name in steps:
        path = ckpt_dir / STAGE_DIR.format(index=0) / name
        if not (path / CKPT_STATE).is_file():
            first_missing = first_missing or f"{name}: stage 0's checkpoint"
            continue
        world = int(json.loads((path / CKPT_STATE).read_text()).get("world_size", 0))
        lacking = [s for s in range(world) if not (
            ckpt_dir / STAGE_DIR.format(index=s) / name / CKPT_MODEL).is_file()]
        if not lacking:
            return path
        first_missing = first_missing or f"{name}: stage {lacking[0]}'s checkpoint (of {world})"
    if first_missing:
        raise ExportError(f"{ckpt_dir}: no pipeline checkpoint with every stage's on this "
                          f"node ({first_missing} is not here)")
    raise ExportError(f"{ckpt_dir}: no checkpoint of step {step}" if step is not None
                      else f"{ckpt_dir}: no complete checkpoint to export")


def stage_weights(checkpoint: Path) -> dict[str, mx.array]:
    """The whole model's weights: ``checkpoint``'s (a stage's) merged by name with the same
    step's of every other stage beside it (each holds its layers under the whole model's
    names; a tied embedding is in the first and the last, the same bits)."""
    if checkpoint.parent.name != STAGE_DIR.format(index=0):
        return dict(mx.load(str(checkpoint / CKPT_MODEL)))
    merged: dict[str, mx.array] = {}
    for stage_dir in sorted(checkpoint.parent.parent.glob(STAGE_DIR.format(index="*"))):
        if (stage_dir / checkpoint.name / CKPT_MODEL).is_file():
            merged.update(mx.load(str(stage_dir / checkpoint.name / CKPT_MODEL)))
    return merged


def fuse_checkpoint(checkpoint: Path, out: Path) -> ExportAnswer:
    """A fine-tuning checkpoint's adapters fused into its base model, by mlx-lm's fuse."""
    state = json.loads((checkpoint / CKPT_STATE).read_text())
    try:
        base = state["config"]["model"]["path"]
    except (KeyError, TypeError):
        raise ExportError(f"{checkpoint / CKPT_STATE}: no config.model.path (the base "
                          "model the adapters were trained on)") from None
    if not (Path(base) / "config.json").is_file():
        raise ExportError(f"{checkpoint}: its base model {base} is not on this node")
    fused = subprocess.run([sys.executable, "-m", "mlx_lm", "fuse", "--model", base,
                            "--adapter-path", str(checkpoint), "--save-path", str(out)],
                           capture_output=True, text=True)
    if fused.returncode != 0:
        lines = (fused.stderr or fused.stdout).strip().splitlines() or ["no output"]
        raise RuntimeError(f"mlx_lm fuse failed (exit {fused.returncode}): {lines[-1]}")
    return ExportAnswer(step=int(state["step"]), arch="fused", checkpoint=str(checkpoint),
                        out=str(out), files=sorted(p.name for p in out.iterdir()))


def export_checkpoint(checkpoint: Path, out: Path, arch: str = DEFAULT_ARCH) -> ExportAnswer:
    """Write ``checkpoint`` (a ``step-*`` directory) to ``out`` in mlx-lm's layout: the
    bundled trainer's converted, a fine-tuning run's fused (``arch`` is then its base
    model's)."""
    if (checkpoint / ADAPTER_CONFIG).is_file():
        return fuse_checkpoint(checkpoint, out)
    state = json.loads((checkpoint / CKPT_STATE).read_text())
    try:
        config = from_dict(state["config"], where=str(checkpoint / CKPT_STATE))
    except (ConfigError, KeyError) as exc:
        raise ExportError(f"{checkpoint / CKPT_STATE}: unreadable config: {exc}") from None
    model = config.model
    files = tokenizer_files(model.vocab_size)  # refuses a vocabulary that is not bytes
    weights = stage_weights(checkpoint)
    absent = sorted(_consumed(model) - set(weights))
    if absent:
        raise ExportError(f"{checkpoint}: no stage's checkpoint here holds {absent[0]} "
                          f"({len(absent)} weights of the model missing)")
    weights = convert_weights(weights, model, arch)
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / WEIGHTS), weights, metadata={"format": "mlx"})
    index = {"metadata": {"total_size": sum(v.nbytes for v in weights.values())},
             "weight_map": {name: WEIGHTS for name in sorted(weights)}}
    files[WEIGHTS_INDEX] = index
    files["config.json"] = model_config(model, arch)
    for name, doc in files.items():
        (out / name).write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    return ExportAnswer(step=int(state["step"]), arch=arch, checkpoint=str(checkpoint),
                        out=str(out), files=sorted([WEIGHTS, *files]))


def main(argv: list[str] | None = None) -> int:
    """``python -m mlxops.trainer.export --run-dir DIR [--step N] --out DIR``: one JSON
    line (:class:`~mlxops.node.protocol.serve.ExportAnswer`), or one error line and exit 2.
    Its words: :func:`mlxops.node.protocol.serve.export_args`."""
    args = export_parser().parse_args(argv)
    try:
        done = export_checkpoint(find_checkpoint(Path(args.run_dir), args.step, args.best),
                                 Path(args.out), args.arch)
    except ExportError as exc:
        sys.stderr.write(f"export: {exc}\n")
        return exc.exit_code
    sys.stdout.write(json.dumps(done.to_dict()) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
