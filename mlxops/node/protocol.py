"""The controller-node protocol: the one definition of what crosses the SSH boundary.

Standard library only. The controller (``mlxops.jobs``), the node helpers
(``python -m mlxops.node``) and the trainer all import this module, and the node side imports
nothing else of mlxops: it is synced to every node with the trainer. A name, a file or a
state spelt here is spelt nowhere else. The contract is written out for people in
``docs/node-protocol.md``.

Vocabulary:

* backends MLX can run a job on, and which of them mlxops renders for;
* the states of a rank and of a job (``mlxops status``), and the trainer's progress states;
* the run directory of a job on a node (``<mlxops_root>/runs/<name>/``) and the rule for a
  complete checkpoint inside it.
"""

from __future__ import annotations

import json
from pathlib import Path, PurePath

# --- backends ------------------------------------------------------------------------------

RING, MPI, JACCL, JACCL_RING = "ring", "mpi", "jaccl", "jaccl-ring"
#: Every backend a job, a hostfile or a host's ``mlxops_backend`` may name. (MLX's ``nccl``
#: is CUDA only: no Mac runs it, so mlxops never offers it.)
BACKENDS = (RING, MPI, JACCL, JACCL_RING)
#: RDMA over Thunderbolt 5: macOS only, ``MLX_IBV_DEVICES`` + a coordinator.
JACCL_BACKENDS = (JACCL, JACCL_RING)
DEFAULT_BACKEND = RING

# --- states --------------------------------------------------------------------------------

RUNNING, FINISHED, FAILED, STALLED, STOPPED = "running", "finished", "failed", "stalled", "stopped"
UNREACHABLE = "unreachable"
#: A rank's state in ``mlxops status`` (unreachable: its host did not answer).
RANK_STATES = (RUNNING, FINISHED, FAILED, STALLED, STOPPED, UNREACHABLE)
#: A job's state: the record's, and the one ``mlxops status`` derives from its ranks.
JOB_STATES = (RUNNING, FINISHED, FAILED, STALLED, STOPPED)
#: States after which nothing of the job runs any more.
ENDED_STATES = (FINISHED, FAILED, STOPPED)
#: What the trainer writes in ``progress/rank-<r>.json``.
PROGRESS_STATES = (RUNNING, FINISHED)

# --- the run directory ---------------------------------------------------------------------

#: The mpi launcher (mpirun, on a job's first host): its files are ``launcher.*`` and it is
#: keyed ``"launcher"`` wherever ranks are keyed by number (logs, status, stop answers).
LAUNCHER = "launcher"

STOPPED_MARKER = "stopped"      # present while the job was stopped on purpose by mlxops
PROGRESS_DIR = "progress"
METRICS = "metrics.jsonl"       # rank 0's node: one JSON object per logged step
TRAINER_CONFIG = "trainer.json"
RING_HOSTFILE = "hostfile.json"
IBV_DEVICES = "ibv_devices.json"
CKPT_DIR = "ckpt"
LATEST = "latest"               # ckpt/latest: the name of the newest checkpoint directory
CKPT_PREFIX = "step-"
CKPT_STATE = "state.json"
#: What a complete checkpoint directory holds.
CKPT_FILES = ("model.safetensors", "optimizer.safetensors", CKPT_STATE)

#: The files of one process the run directory keeps: its start script, pid (the process
#: group it leads), combined stdout+stderr, and exit code (written when it ends by itself).
SCRIPT, PID, LOG, EXIT = "sh", "pid", "log", "exit"


def stem(rank: int | str) -> str:
    """``rank-3`` for rank 3, ``launcher`` for the launcher."""
    return LAUNCHER if rank == LAUNCHER else f"rank-{int(rank)}"


def process_file(rank: int | str, kind: str) -> str:
    """``rank-3.pid``, ``launcher.log``, ...: a file of one rank (or the launcher)."""
    return f"{stem(rank)}.{kind}"


def progress_file(rank: int) -> str:
    """The trainer's heartbeat of one rank, relative to the run directory."""
    return f"{PROGRESS_DIR}/rank-{int(rank)}.json"


def rank_of_script(name: str) -> int | None:
    """3 for ``rank-3.sh``; None for any other name."""
    if not (name.startswith("rank-") and name.endswith(f".{SCRIPT}")):
        return None
    number = name[len("rank-"):-len(SCRIPT) - 1]
    return int(number) if number.isdigit() else None


def checkpoint_name(step: int) -> str:
    """``step-00000050``: zero-padded, so names sort like steps."""
    return f"{CKPT_PREFIX}{step:08d}"


def checkpoint_step(name: str) -> int | None:
    """50 for ``step-00000050``; None for any other name (``.tmp-*``, ``latest``)."""
    if not name.startswith(CKPT_PREFIX):
        return None
    number = name[len(CKPT_PREFIX):]
    return int(number) if number.isdigit() else None


def checkpoint_complete(path: PurePath) -> bool:
    """The one rule for a usable checkpoint: every file present, ``state.json`` readable.

    A checkpoint is written under a temporary name and renamed into place, so a directory
    named ``step-*`` is normally whole; this also refuses one damaged afterwards.
    """
    directory = Path(path)
    if checkpoint_step(directory.name) is None:
        return False
    if not all((directory / f).is_file() for f in CKPT_FILES):
        return False
    try:
        json.loads((directory / CKPT_STATE).read_text())
    except (OSError, ValueError):
        return False
    return True
