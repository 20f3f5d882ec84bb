"""``python -m mlxops.trainer --config FILE [--set KEY=VALUE ...] [--resume]``."""

from __future__ import annotations

import argparse
import sys
import textwrap

from mlxops.node.protocol.metrics import FIELDS as METRICS_FIELDS
from mlxops.node.protocol.rankenv import VARIABLES as _VAR

from .config import ConfigError, describe_options, load_config

_METRICS_FIELDS = textwrap.fill(", ".join(METRICS_FIELDS), width=90,
                                initial_indent=" " * 27, subsequent_indent=" " * 27)

EPILOG = f"""\
config keys (section.key, default, meaning); the file is JSON, or YAML if PyYAML is installed:
{describe_options()}

files under out:
  metrics.jsonl            rank 0: one JSON object per logged step, with
{_METRICS_FIELDS}
  progress/rank-<r>.json   every rank, after a step at most every 0.5 s (running|finished)
  calibration.json         train.balance auto: the samples/s it measured and the split taken
  ckpt/step-XXXXXXXX/      model.safetensors, optimizer.safetensors, state.json; ckpt/latest
  best/step-XXXXXXXX/      train.eval_every: the checkpoint of the lowest validation loss

environment:
  {_VAR["world_size"]:<19} expected number of ranks (else derived from mlx.launch's variables);
                      above 1, mx.distributed.init(strict=True) must yield exactly that many
  {_VAR["backend"]:<19} distributed backend (default "any")
  {_VAR["local_rank"]:<19} rank index within its host; local rank 0 writes that node's checkpoints
                      (absent: hostnames are all-gathered, the lowest rank per host writes)
  {_VAR["host"]:<19} the rank's host as the inventory names it (else the hostname)
  test hooks:         MLXOPS_TRAINER_CKPT_DELAY=SECONDS sleeps mid checkpoint write;
                      MLXOPS_TRAINER_FAKE_OOM=STEP (or RANK:STEP) simulates one
                      allocation failure there (on every rank, or on that one);
                      MLXOPS_TRAINER_FAKE_DIVERGE=RANK:STEP makes that rank's weights drift
                      after that step (train.consistency_every repairs it);
                      MLXOPS_TRAINER_FAKE_SLOW=RANK:SECONDS slows that rank's compute by
                      SECONDS per sequence (train.balance: auto measures it)

exit codes: 0 all steps done; 2 bad config or arguments; 1 any other failure.
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m mlxops.trainer",
        description="Train a decoder-only transformer LM, data-parallel over MLX distributed.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", required=True, metavar="FILE",
                   help="trainer config (JSON, or YAML when PyYAML is importable)")
    p.add_argument("--set", dest="overrides", action="append", default=[],
                   metavar="KEY=VALUE",
                   help="override a config key, e.g. --set train.steps=40 --set out=runs/x "
                        "(value parsed as JSON when it parses; repeatable)")
    p.add_argument("--resume", action="store_true",
                   help="continue from the newest complete checkpoint in out (starts at step "
                        "0 if there is none); without it an out holding checkpoints is refused")
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
    # Imported late so that --help and config errors never pay for (or need) mlx.
    from .distributed import DistributedError
    from .train import TrainerError, train

    try:
        train(cfg, resume=args.resume)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (DistributedError, TrainerError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
