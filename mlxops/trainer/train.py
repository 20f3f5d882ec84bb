"""The bundled trainer's run: the loop (:mod:`.loop`) over its workload, data parallel
(:class:`~.bundled.TrainerWorkload`) or pipeline stages with ``train.stages``
(:class:`~.pipelinerun.PipelineTrainerWorkload`, which builds on it).

The choice lives here, above both workloads, so that neither imports the other's chooser
(an import cycle otherwise: the pipeline workload subclasses the data-parallel one).
"""

from __future__ import annotations

from .bundled import TrainerWorkload, make_optimizer
from .config import TrainerConfig
from .errors import TrainerError
from .loop import Loop

__all__ = ["TrainerError", "TrainerWorkload", "make_optimizer", "train", "trainer_loop"]


def trainer_loop(cfg: TrainerConfig, resume: bool = False) -> Loop:
    """The run loop over the bundled trainer, ready to :meth:`~.loop.Loop.run`: data
    parallel, or pipeline stages with ``train.stages`` (:mod:`.pipelinerun`)."""
    if cfg.train.stages is not None:
        from .pipelinerun import PipelineTrainerWorkload  # only a pipeline job needs it

        return Loop(PipelineTrainerWorkload(cfg), resume)
    return Loop(TrainerWorkload(cfg), resume)


def train(cfg: TrainerConfig, resume: bool = False) -> None:
    trainer_loop(cfg, resume).run()
