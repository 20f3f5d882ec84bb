"""A jaccl init that failed is never retried: the watchdog's rule for RDMA set-up errors.

MLX's jaccl backend sets up RDMA over Thunderbolt when the ranks start
(``mx.distributed.init``). When that fails, retrying does not help and can hurt: each
failed set-up can leave a protection domain behind in the kernel, and repeated set-ups
have wedged ports until a reboot (ml-explore/mlx#3162: errno 16 "is not transient, a retry
can never succeed"; MACS.md). So a rank whose error is one of jaccl's set-up errors ends
the job with the reason and the fix, instead of the watchdog's restart.

The errors, as MLX raises them (mlx/distributed/jaccl, ``std::runtime_error``):
``[jaccl] Couldn't allocate protection domain``, ``[jaccl] Couldn't create completion
queue``, ``[jaccl] Couldn't connect (error: N)``, ``[jaccl] Changing queue pair to RTR
failed with errno N`` (errno 22 while a Thunderbolt Bridge holds the port), and the other
``[jaccl] Couldn't ...`` forms. A rank that lost its peer mid-run says something else
and is restarted as usual.
"""

from __future__ import annotations

from mlxops.jobs.status import JobStatus
from mlxops.node.protocol import FAILED, JACCL_BACKENDS

#: What the line of a rank's log that says why it failed holds when jaccl's set-up failed.
INIT_ERRORS = ("[jaccl] Couldn't", "[jaccl] Changing queue pair")
FIX = ("not retried: a failed RDMA set-up can leave resources only a reboot frees; run "
       "mlxops check with the job (--job) and reboot this Mac if it reports nothing")


def jaccl_init_failure(status: JobStatus, backend: str) -> str | None:
    """The message the job ends with when a rank's jaccl set-up failed, else None."""
    if backend not in JACCL_BACKENDS:
        return None
    for rank in status.ranks:
        if rank.state == FAILED and rank.failure and \
                any(error in rank.failure for error in INIT_ERRORS):
            return (f"jaccl set-up failed on {rank.host} (rank {rank.rank}): "
                    f"{rank.failure}; {FIX.replace('this Mac', rank.host)}")
    return None
