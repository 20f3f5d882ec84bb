"""``python -m mlxops.finetune --config FILE [--set KEY=VALUE ...] [--resume]``."""

from __future__ import annotations

import argparse
import sys

from mlxops.node.protocol.rankenv import VARIABLES as _VAR

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
MLXOPS_TRAINER_FAKE_SLOW, MLXOPS_TRAINER_CKPT_DELAY).

exit codes: 0 all steps done (or patience ran out); 2 bad config or arguments; 1 any
other failure.
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m mlxops.finetune",
        description="Fine-tune a Hugging Face / mlx-lm model (LoRA, DoRA or full), "
                    "data-parallel over MLX distributed.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, metavar="FILE",
                   help="fine-tuning config (JSON, or YAML when PyYAML is importable)")
    p.add_argument("--set", dest="overrides", action="append", default=[],
                   metavar="KEY=VALUE",
                   help="override a config key, e.g. --set train.steps=40 (value parsed as "
                        "JSON when it parses; repeatable)")
    p.add_argument("--resume", action="store_true",
                   help="continue from the newest complete checkpoint in out (step 0 if "
                        "there is none); without it an out holding checkpoints is refused")
    p.add_argument("--print-config", action="store_true",
                   help="print the resolved config as JSON and exit")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.print_config:
        import json

        print(json.dumps(cfg.to_dict(), indent=2))
        return 0
    # Imported late: --help and config errors never pay for (or need) mlx and mlx-lm.
    from mlxops.trainer.distributed import DistributedError
    from mlxops.trainer.train import TrainerError

    from .train import finetune

    try:
        finetune(cfg, resume=args.resume)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (DistributedError, TrainerError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
