"""Fine-tuning's run: the loop (:mod:`mlxops.trainer.loop`) over its workload, data
parallel (:class:`~.workload.FinetuneWorkload`) or pipeline stages with ``train.stages``
(:class:`~.pipelinerun.PipelineFinetuneWorkload`, which builds on it).

The choice lives here, above both workloads, so that neither imports the other's chooser
(an import cycle otherwise: the pipeline workload subclasses the data-parallel one), as
the bundled trainer's (:mod:`mlxops.trainer.train`).
"""

from __future__ import annotations

from mlxops.trainer.loop import Loop

from .config import FinetuneConfig
from .workload import WORDS, FinetuneWorkload

__all__ = ["WORDS", "FinetuneWorkload", "finetune", "finetune_loop"]


def finetune_loop(cfg: FinetuneConfig, resume: bool = False) -> Loop:
    """The run loop over a fine-tuning, ready to :meth:`~mlxops.trainer.loop.Loop.run`:
    data parallel, or over pipeline stages with ``train.stages``
    (:class:`~.pipelinerun.PipelineFinetuneWorkload`)."""
    if cfg.train.stages is not None:
        from .pipelinerun import PipelineFinetuneWorkload  # only a pipeline job needs it

        return Loop(PipelineFinetuneWorkload(cfg), resume)
    return Loop(FinetuneWorkload(cfg), resume)


def finetune(cfg: FinetuneConfig, resume: bool = False) -> None:
    finetune_loop(cfg, resume).run()
