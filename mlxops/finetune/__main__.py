"""``python -m mlxops.finetune --config FILE [--set KEY=VALUE ...] [--resume]``."""

from __future__ import annotations

import sys

from mlxops.node.protocol.rankenv import VARIABLES as _VAR
from mlxops.trainer.entry import run

from .config import ConfigError, describe_options, load_config

EPILOG = f"""\
config keys (section.key, default, meaning); the file is JSON, or YAML if PyYAML is installed:
{describe_options()}

files under out: metrics.jsonl (rank 0; the trainer's fields, with val_loss and
trainable_params), progress/rank-<r>.json, calibration.json (balance auto),
ckpt/step-XXXXXXXX/ and best/step-XXXXXXXX/ (model.safetensors: the trainable weights,
optimizer.safetensors, state.json, and the adapters in mlx-lm's format:
adapters.safetensors + adapter_config.json, for mlx_lm.generate --adapter-path DIR).

environment and test hooks: those of python -m mlxops.trainer ({_VAR["world_size"]},
{_VAR["local_rank"]}, {_VAR["backend"]}, {_VAR["host"]}, MLXOPS_TRAINER_FAKE_OOM,
MLXOPS_TRAINER_FAKE_SLOW, MLXOPS_TRAINER_CKPT_DELAY, MLXOPS_TRAINER_HOLD).

exit codes: 0 all steps done (or patience ran out); 2 bad config or arguments; 1 any
other failure.
"""


def _finetune(cfg, resume: bool) -> None:
    from .train import finetune

    finetune(cfg, resume=resume)


def main(argv: list[str] | None = None) -> int:
    return run(argv, prog="python -m mlxops.finetune",
               description="Fine-tune a Hugging Face / mlx-lm model (LoRA, DoRA or full), "
                           "data-parallel over MLX distributed.",
               epilog=EPILOG, what="fine-tuning", set_example="--set train.steps=40",
               load_config=load_config, config_error=ConfigError, start=_finetune)


if __name__ == "__main__":
    sys.exit(main())
