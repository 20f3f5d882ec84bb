"""What a serve job's ranks run (docs/job-file.md, "Serving"): ``python -m mlx_lm server``
with the job's model and options, one rank per host.

Every rank runs the same command: mlx-lm's server joins MLX's distributed group (the ring
hostfile and ``MLX_RANK`` the rank machinery gives any job), rank 0 serves HTTP on
``bind``:``port`` and the others take their share of every forward (``--pipeline``: their
layers; else tensor parallel: their slice of each weight). A model that is a training
job's checkpoint is exported first, on each node, into the serve job's run directory
(:func:`prepare_lines`: the rank fails with the exporter's exit code if it cannot).
"""

from __future__ import annotations

from mlxops import shell
from mlxops.jobs.placement import NodePaths, Rank
from mlxops.jobs.servespec import PIPELINE, ServeSpec
from mlxops.node.protocol.serve import (
    SERVE_MODEL_DIR,
    SERVER_ARGV,
    export_args,
    server_options,
)


def model_dir(serve: ServeSpec, paths: NodePaths) -> str:
    """Where the server reads its model on the node."""
    if serve.model_job is None:
        assert serve.model is not None, "parse_serve requires one of model, model_job"
        return serve.model
    return paths.run_file(SERVE_MODEL_DIR)


#: mlx-lm's ``/v1/models`` scans the Hugging Face cache and fails (an empty answer) where
#: the cache directory does not exist, as on a node that never downloaded a model: made
#: first, where huggingface_hub looks for it (a constant line: nothing of the user's in it).
HF_CACHE_LINE = 'mkdir -p "${HF_HUB_CACHE:-${HF_HOME:-$HOME/.cache/huggingface}/hub}"'


def prepare_lines(serve: ServeSpec, python: str, paths: NodePaths) -> list[str]:
    """What runs before the server: the Hugging Face cache directory, and the export of a
    training job's checkpoint (for a model directory, nothing more)."""
    lines = [HF_CACHE_LINE]
    if serve.model_job is not None:
        source = NodePaths(paths.root, serve.model_job).run_dir
        lines.append(shell.join([python, *export_args(run_dir=source, step=serve.model_step,
                                                      best=serve.model_best,
                                                      arch=serve.export_arch),
                                 "--out", paths.run_file(SERVE_MODEL_DIR)]))
    return lines


def server_argv(serve: ServeSpec, python: str, paths: NodePaths, rank: Rank,
                world_size: int) -> list[str]:
    """``python -m mlx_lm server --model ... --host BIND --port PORT [options]``. Alone
    (a restart that went on without the other hosts, ``restart.exclude_unreachable``)
    the server holds the whole model: no ``--pipeline`` then."""
    flags = [("model", model_dir(serve, paths)), ("host", serve.bind), ("port", serve.port),
             ("pipeline", serve.parallel == PIPELINE and world_size > 1),
             *sorted(serve.options.items())]
    return [python, *SERVER_ARGV, *server_options(flags)]
