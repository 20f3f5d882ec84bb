"""``python -m mlxops.trainer --config FILE [--set KEY=VALUE ...] [--resume]``."""

from __future__ import annotations

import sys
import textwrap

from mlxops.node.protocol.metrics import FIELDS as METRICS_FIELDS
from mlxops.node.protocol.rankenv import VARIABLES as _VAR

from .config import ConfigError, describe_options, load_config
from .entry import run

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
                      Metal out-of-memory there (on every rank, or on that one);
                      MLXOPS_TRAINER_FAKE_DIVERGE=RANK:STEP makes that rank's weights drift
                      after that step (train.consistency_every repairs it);
                      MLXOPS_TRAINER_FAKE_SLOW=RANK:SECONDS slows that rank's compute by
                      SECONDS per sequence (train.balance: auto measures it)

exit codes: 0 all steps done; 2 bad config or arguments; 1 any other failure.
"""


def _train(cfg, resume: bool) -> None:
    from .train import train

    train(cfg, resume=resume)


def main(argv: list[str] | None = None) -> int:
    return run(argv, prog="python -m mlxops.trainer",
               description="Train a decoder-only transformer LM, data-parallel over MLX "
                           "distributed.",
               epilog=EPILOG, what="trainer",
               set_example="--set train.steps=40 --set out=runs/x",
               load_config=load_config, config_error=ConfigError, start=_train)


if __name__ == "__main__":
    sys.exit(main())
