"""The bundled MLX trainer: a data-parallel decoder-only transformer LM with exact resume.

It imports only mlx, numpy, the standard library and :mod:`mlxops.node.protocol` (standard
library only, synced beside it: the run directory's names), because mlxops syncs this
package to every node and runs it there on its own. Launch it like this (nanoGPT style):

    # one process
    python -m mlxops.trainer --config trainer.json

    # 2 ranks on this machine over the ring backend
    python -m mlx.launch --hosts 127.0.0.1,127.0.0.1 --backend ring -- \\
        python -m mlxops.trainer --config trainer.json

    # override any config key, resume from the newest complete checkpoint
    python -m mlxops.trainer --config trainer.json --set train.steps=400 --resume

    # what mlxops runs on every rank: MLXOPS_WORLD_SIZE, MLXOPS_LOCAL_RANK, MLXOPS_BACKEND set
    mlxops launch jobs/demo.yml

This ``__init__`` imports nothing heavy: the controller imports ``mlxops.trainer.config``
and ``mlxops.trainer.plan`` (standard library only) without needing mlx.
"""

from .config import ConfigError, TrainerConfig, default_config, load_config

__all__ = ["ConfigError", "TrainerConfig", "default_config", "load_config"]
