"""Fine-tuning real language models (issue 18): mlx-lm's parts, mlxops' loop.

mlx-lm loads the model and tokenizer, applies chat templates, builds LoRA/DoRA layers and
defines the adapters' format; fine-tuning is a workload of the bundled trainer's run loop
(:mod:`mlxops.trainer.loop`): the step (one compiled function with the all-reduce inside,
:mod:`mlxops.trainer.step`), the unequal split, the consistency check, the out-of-memory
back-off, heartbeats, metrics and exact-resume checkpoints are the loop's.

    python -m mlxops.finetune --config finetune.json [--resume] [--set KEY=VALUE ...]

Synced to nodes beside :mod:`mlxops.trainer`: standard library, mlx, numpy and mlx-lm
only. This ``__init__`` imports nothing heavy: the controller imports
``mlxops.finetune.config`` (standard library only) to check a job's ``finetune:`` section.
"""

from .config import ConfigError, FinetuneConfig, load_config

__all__ = ["ConfigError", "FinetuneConfig", "load_config"]
