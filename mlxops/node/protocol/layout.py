"""Where things are on a node: the node root's layout (``<mlxops_root>/code``, ``runs/``,
``cache/``) and a job's run directory (``runs/<name>/``) with the rule for a complete
checkpoint inside it. A file or directory name spelt here is spelt nowhere else."""

from __future__ import annotations

import json
from pathlib import Path, PurePath

# --- the run directory ---------------------------------------------------------------------

#: The mpi launcher (mpirun, on a job's first host): its files are ``launcher.*`` and it is
#: keyed ``"launcher"`` wherever ranks are keyed by number (logs, status, stop answers).
LAUNCHER = "launcher"

STOPPED_MARKER = "stopped"      # present while the job was stopped on purpose by mlxops
PROGRESS_DIR = "progress"
METRICS = "metrics.jsonl"       # rank 0's node: one JSON object per logged step
#: Every node (its writer rank): the speeds ``train.balance: auto`` measured and the split
#: they gave (docs/trainer.md); ``mlxops plan`` reads the job's last one.
CALIBRATION = "calibration.json"
TRAINER_CONFIG = "trainer.json"
FINETUNE_CONFIG = "finetune.json"  # a finetune: job's config (mlxops.finetune's), per node
RING_HOSTFILE = "hostfile.json"
IBV_DEVICES = "ibv_devices.json"
CKPT_DIR = "ckpt"
#: The checkpoint with the lowest validation loss (train.eval_every, and fine-tuning's
#: eval_every), kept apart from the rolling ones in ckpt/: ``best/step-XXXXXXXX/`` and
#: ``best/latest``, as in ckpt/; one kept (docs/trainer.md, docs/finetune.md).
BEST_DIR = "best"
LATEST = "latest"               # ckpt/latest: the name of the newest checkpoint directory
CKPT_PREFIX = "step-"
CKPT_STATE = "state.json"
CKPT_MODEL, CKPT_OPTIMIZER = "model.safetensors", "optimizer.safetensors"
#: What a complete checkpoint directory holds.
CKPT_FILES = (CKPT_MODEL, CKPT_OPTIMIZER, CKPT_STATE)

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


def complete_checkpoints(ckpt_dir: PurePath) -> list[Path]:
    """The complete checkpoints in a ``ckpt/`` directory, oldest first."""
    directory = Path(ckpt_dir)
    if not directory.is_dir():
        return []
    found = [d for d in directory.iterdir() if checkpoint_complete(d)]
    return sorted(found, key=lambda d: checkpoint_step(d.name) or 0)


def newest_checkpoint(ckpt_dir: PurePath) -> Path | None:
    """The one rule for "the newest checkpoint" of a ``ckpt/`` (or ``best/``) directory:
    the one ``latest`` names when it is complete, unless a newer complete one exists (a
    rank died between its rename and the pointer's); without a usable pointer, the newest
    complete one; None when there is none. The trainer's resume, ``export`` and ``fetch``
    all choose by it, on the node."""
    directory = Path(ckpt_dir)
    found = complete_checkpoints(directory)
    try:
        target = directory / (directory / LATEST).read_text().strip()
    except OSError:
        target = None
    if target is not None and checkpoint_complete(target):
        return found[-1] if found and found[-1].name > target.name else target
    return found[-1] if found else None


# --- the node root ---------------------------------------------------------------------
# Under a node's ``mlxops_root``, each written by one provision task or by launch, and
# found by every other reader through these names.

#: The synced code (``PYTHONPATH``; ``tasks/sync.py``) and the jobs' run directories.
CODE_DIR, RUNS_DIR = "code", "runs"
#: Under ``code/``: a job's synced ``workdir``, ``code/jobs/<name>``.
JOB_CODE_DIR = "jobs"
#: The managed environment every rank sources (``tasks/env.py``), mode 0600.
ENV_FILE = "env.sh"
#: The cluster's hostfiles, one per backend (``tasks/hostfiles.py``).
HOSTFILES_DIR = "hostfiles"
#: The venv ``mlxops provision`` makes (``tasks/python.py``); its interpreter, when there,
#: wins over ``mlxops_python``.
VENV_DIR = "venv"
VENV_PYTHON = f"{VENV_DIR}/bin/python"

#: The run's own temporary directory, ``TMPDIR`` of its ranks: the node user's, mode 0700,
#: emptied when an attempt starts (``spawn``), removed with the run directory. A shared
#: ``/tmp`` is not safe to compile in: MLX's CPU backend writes and g++-compiles its kernels
#: under ``$TMPDIR/mlx/<version>/cpu/``, and where another user ran MLX first that directory
#: is theirs (every compiled step fails) or, worse, holds libraries they built.
TMP_DIR = "tmp"
#: The name MLX gives its directory under ``$TMPDIR``; in the run's ``tmp/`` it is a link
#: to the node user's kernel cache, so a job does not compile every kernel again.
MLX_TMP = "mlx"
#: Under ``mlxops_root``: what is kept across runs to save time (it may link elsewhere).
CACHE = "cache"
#: The node user's compiled-kernel cache, relative to ``mlxops_root``: used only while it
#: is the user's and no other user can write to it.
KERNEL_CACHE = f"{CACHE}/{MLX_TMP}"
#: The first line a rank's start script prints to its log, each attempt (followed by
#: `` (pid N)``): what came before it in the log is an earlier attempt's.
START_LINE = "mlxops: started"


#: Under ``mlxops_root``: directories of large files a job reads (prepared token shards, a
#: base model), one per directory on the controller (``jobs/content.py`` names them).
DATA_DIR = "data"
#: The node's sha256 of each file under them, by path, size, mtime and inode
#: (``node/content.py``): a launch hashes only what changed since the last one. Not under
#: ``cache/``, which may link to a place other nodes share (the sandbox's nodes do): two
#: nodes would overwrite each other's entries for the same path.
CONTENT_HASHES = f"{DATA_DIR}/.content-hashes.json"


def run_path(name: str) -> str:
    """``runs/<name>``: a job's run directory, relative to ``mlxops_root``."""
    return f"{RUNS_DIR}/{name}"


def job_code_path(name: str) -> str:
    """``jobs/<name>``: a job's synced workdir, relative to ``code/``."""
    return f"{JOB_CODE_DIR}/{name}"


def kernel_cache_path(run_dir: PurePath) -> Path:
    """``<mlxops_root>/cache/mlx`` of the run directory ``<mlxops_root>/runs/<name>``."""
    return Path(run_dir).parent.parent / KERNEL_CACHE


def rank_glob(kind: str) -> str:
    """``rank-*.pid``: a glob of one kind of file of every rank."""
    return f"rank-*.{kind}"


def attempt_files() -> list[str]:
    """Globs, relative to the run directory, of what one attempt leaves that the next must
    not read as its own: scripts, pids, exit codes and heartbeats (never logs, metrics or
    checkpoints). Cleared before an attempt's files are written."""
    kinds = (SCRIPT, PID, EXIT)
    return [*(rank_glob(k) for k in kinds), *(process_file(LAUNCHER, k) for k in kinds),
            f"{PROGRESS_DIR}/{rank_glob('json')}"]

