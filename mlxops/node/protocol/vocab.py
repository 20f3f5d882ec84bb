"""The protocol's words: the backends MLX can run a job on, and the states of a rank, of a
job and of the trainer's progress. Every other module spells these through here."""

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
#: A rank's heartbeat before its first step (loading, compiling): alive, not yet stepping.
STARTING = "starting"
#: What the trainer writes in ``progress/rank-<r>.json``.
PROGRESS_STATES = (STARTING, RUNNING, FINISHED)
