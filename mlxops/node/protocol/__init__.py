"""The controller-node protocol: the one definition of what crosses the SSH boundary.

Standard library only. The controller (``mlxops.jobs``), the node helpers
(``python -m mlxops.node``) and the trainer all import this package, and the node side imports
nothing else of mlxops: it is synced to every node with the trainer. A name, a file or a
state spelt here is spelt nowhere else. The contract is written out for people in
``docs/node-protocol.md``. One module per topic, each importing only those before it:

* :mod:`.vocab`: the backends MLX can run a job on, the states of a rank, a job and the
  trainer's progress;
* :mod:`.layout`: the node root's layout and a job's run directory, with the rule for a
  complete checkpoint;
* :mod:`.decode`: the one decoder of every record (JSON -> dataclass, naming a missing or
  mistyped field);
* :mod:`.bench`, :mod:`.commands`: each node command's argument list (built by the
  controller, parsed by the node with :func:`parser`);
* :mod:`.answers`: each command's answer, a record the node prints as one line of JSON and
  the controller reads back with :func:`parse_answer`.

* :mod:`.metrics`: the trainer's ``metrics.jsonl`` line.
* :mod:`.calibration`: the trainer's ``calibration.json`` (``balance: auto``'s speeds) and
  the ``calibration`` command that reads it.
* :mod:`.channel`: the watch channel's message (the ``watch`` command's stream of lines).
* :mod:`.send`: the ``send`` command, whose answer line is followed by a tar of files.

This module re-exports the names of the first five, so callers write ``protocol.STATUS``
(those of :mod:`.commands` and :mod:`.answers` imported when first asked for: see
``_LAZY``); the records of one writer and few readers are imported from their own module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mlxops.node.lazy import lazy_names
from mlxops.node.protocol.decode import (
    ProtocolError,
    Record,
    decode,
)
from mlxops.node.protocol.layout import (
    BEST_DIR,
    CACHE,
    CALIBRATION,
    CKPT_DIR,
    CKPT_FILES,
    CKPT_MODEL,
    CKPT_OPTIMIZER,
    CKPT_PREFIX,
    CKPT_STATE,
    CODE_DIR,
    ENV_FILE,
    EXIT,
    FINETUNE_CONFIG,
    HOSTFILES_DIR,
    IBV_DEVICES,
    JOB_CODE_DIR,
    KERNEL_CACHE,
    LATEST,
    LAUNCHER,
    LOG,
    METRICS,
    MLX_TMP,
    PID,
    PROGRESS_DIR,
    RING_HOSTFILE,
    RUNS_DIR,
    SCRIPT,
    START_LINE,
    STOPPED_MARKER,
    TMP_DIR,
    TRAINER_CONFIG,
    VENV_DIR,
    VENV_PYTHON,
    attempt_files,
    checkpoint_complete,
    checkpoint_name,
    checkpoint_step,
    complete_checkpoints,
    job_code_path,
    kernel_cache_path,
    newest_checkpoint,
    process_file,
    progress_file,
    rank_glob,
    rank_of_script,
    run_path,
    stem,
)
from mlxops.node.protocol.vocab import (
    BACKENDS,
    DEFAULT_BACKEND,
    ENDED_STATES,
    FAILED,
    FINISHED,
    JACCL,
    JACCL_BACKENDS,
    JACCL_RING,
    JOB_STATES,
    MPI,
    PROGRESS_STATES,
    RANK_STATES,
    RING,
    RUNNING,
    STALLED,
    STARTING,
    STOPPED,
    UNREACHABLE,
)

#: The names of the two modules not imported with the package, each imported from its
#: module when first asked for (PEP 562's module ``__getattr__``): the commands' argument
#: lists (argparse) and the answers (bench, calibration, content records) cost more than
#: the rest together, and the controller needs them only once it talks to a node, not
#: while a command starts (benchmarks/startup.py).
_LAZY = {
    "commands": (
        "CHECK_COMMANDS", "COMMANDS", "KEEP_CHECKPOINTS", "LOGS", "MONITOR_COMMANDS",
        "PREFLIGHT", "REACH", "READY", "SAMPLE", "SAMPLE_MAX_BYTES", "SPAWN", "STATUS", "STOP",
        "WATCH", "keep_checkpoints_args", "logs_args", "parse_offsets", "parse_peers",
        "parser", "preflight_args", "rank_key", "reach_args", "ready_args", "sample_args",
        "spawn_args", "status_args", "stop_args", "watch_args",
    ),
    "answers": (
        "ANSWERS", "HEARTBEAT_EVERY", "Answer", "GpuSample", "KeepCheckpointsAnswer",
        "LauncherAnswer", "Leftover", "LogChunk", "LogsAnswer", "MetricsChunk",
        "PreflightAnswer", "Progress", "RankAnswer", "ReachAnswer", "ReadyAnswer",
        "RunningRank", "SampleAnswer", "SpawnAnswer", "StatusAnswer", "StopAnswer",
        "answer_line", "parse_answer",
    ),
}
_HOMES = {name: module for module, names in _LAZY.items() for name in names}


__getattr__ = lazy_names(__name__, _HOMES, globals())


if TYPE_CHECKING:
    from mlxops.node.protocol.answers import (
        ANSWERS,
        HEARTBEAT_EVERY,
        Answer,
        GpuSample,
        KeepCheckpointsAnswer,
        LauncherAnswer,
        Leftover,
        LogChunk,
        LogsAnswer,
        MetricsChunk,
        PreflightAnswer,
        Progress,
        RankAnswer,
        ReachAnswer,
        ReadyAnswer,
        RunningRank,
        SampleAnswer,
        SpawnAnswer,
        StatusAnswer,
        StopAnswer,
        answer_line,
        parse_answer,
    )
    from mlxops.node.protocol.commands import (
        CHECK_COMMANDS,
        COMMANDS,
        KEEP_CHECKPOINTS,
        LOGS,
        MONITOR_COMMANDS,
        PREFLIGHT,
        REACH,
        READY,
        SAMPLE,
        SAMPLE_MAX_BYTES,
        SPAWN,
        STATUS,
        STOP,
        WATCH,
        keep_checkpoints_args,
        logs_args,
        parse_offsets,
        parse_peers,
        parser,
        preflight_args,
        rank_key,
        reach_args,
        ready_args,
        sample_args,
        spawn_args,
        status_args,
        stop_args,
        watch_args,
    )

__all__ = [
    "JOB_CODE_DIR",
    "ENV_FILE",
    "HOSTFILES_DIR",
    "VENV_DIR",
    "VENV_PYTHON",
    "job_code_path",
    "RING", "MPI", "JACCL", "JACCL_RING", "BACKENDS", "JACCL_BACKENDS", "DEFAULT_BACKEND",
    "RUNNING", "FINISHED", "FAILED", "STALLED", "STOPPED", "UNREACHABLE", "RANK_STATES",
    "STARTING",
    "JOB_STATES", "ENDED_STATES", "PROGRESS_STATES", "LAUNCHER", "STOPPED_MARKER", "PROGRESS_DIR",
    "METRICS", "CALIBRATION", "TRAINER_CONFIG", "RING_HOSTFILE", "IBV_DEVICES", "CKPT_DIR",
    "FINETUNE_CONFIG",
    "BEST_DIR", "LATEST", "CKPT_PREFIX", "CKPT_STATE", "CKPT_MODEL", "CKPT_OPTIMIZER",
    "CKPT_FILES", "SCRIPT", "PID", "LOG", "EXIT", "stem", "process_file", "progress_file",
    "rank_of_script",
    "checkpoint_name", "checkpoint_step", "checkpoint_complete", "complete_checkpoints",
    "newest_checkpoint",
    "CODE_DIR", "RUNS_DIR", "TMP_DIR", "MLX_TMP", "CACHE", "KERNEL_CACHE", "START_LINE",
    "run_path", "kernel_cache_path", "rank_glob", "attempt_files", "ProtocolError", "Record",
    "decode", "PREFLIGHT", "SPAWN", "STATUS", "STOP", "LOGS", "KEEP_CHECKPOINTS", "COMMANDS",
    "preflight_args", "spawn_args", "status_args", "stop_args", "logs_args",
    "keep_checkpoints_args", "READY", "REACH", "CHECK_COMMANDS", "ready_args", "reach_args",
    "SAMPLE", "MONITOR_COMMANDS", "SAMPLE_MAX_BYTES", "sample_args", "parse_peers",
    "parse_offsets", "rank_key", "parser", "HEARTBEAT_EVERY", "Progress", "Leftover",
    "PreflightAnswer", "SpawnAnswer", "RankAnswer", "LauncherAnswer", "StatusAnswer",
    "StopAnswer", "LogChunk", "LogsAnswer", "KeepCheckpointsAnswer", "RunningRank", "ReadyAnswer",
    "ReachAnswer", "GpuSample", "MetricsChunk", "SampleAnswer", "Answer", "ANSWERS",
    "answer_line", "parse_answer", "WATCH", "watch_args",
]
