"""Each host has room for the job and nothing in its way: disk and memory for the job's
plan (``--job``), its ring ports free, no rank of any job still running, a clock that
agrees with the controller's.

Disk and memory follow the job's own plan, its workload's planner
(:meth:`mlxops.jobs.workloads.Workload.planner`): the bundled trainer's
(:mod:`mlxops.trainer.plan`) for a ``trainer:`` job, fine-tuning's
(:mod:`mlxops.finetune.plan`, from the base model's files) for a ``finetune:`` job; the
disk also counts the contents (a base model and data) pre-flight would still place on the
node."""

from __future__ import annotations

from mlxops.checks import when
from mlxops.jobs.balance import largest_share
from mlxops.jobs.content import missing_bytes
from mlxops.node import protocol

GB = 1024**3
#: Room for logs, metrics and the code, on top of the checkpoints.
MIN_FREE_BYTES = 1 * GB
#: How far a node's clock may be from the controller's, in seconds (beyond what the round
#: trip leaves uncertain). Metrics, checkpoints and logs carry the nodes' own times.
MAX_CLOCK_SKEW = 1.0
NODE_ANSWER = "the node's answer (mlxops.node ready)"


def _planned_job(cluster, node) -> bool:
    """A job whose plan mlxops knows (its workload has a planner: the bundled trainer,
    fine-tuning)."""
    return cluster.target.planner is not None


@when(_planned_job)
def check_disk(node, cluster):
    """Free disk under ``mlxops_root`` for the checkpoints the job keeps (``train.keep``,
    plus the one being written; fine-tuning's ``best/`` too), room for logs and, for
    fine-tuning, the bytes of the base model and the data the node does not hold yet."""
    job = cluster.target.job
    ready = node.need(node.ready, NODE_ANSWER)
    placing = 0
    checkpoint, kept = cluster.target.planner.checkpoints()
    for content in cluster.target.placed:
        listing = node.need(node.placed.get(str(content.local), "not listed"),
                            f"the node's copy of {content.local}")
        placing += missing_bytes(content, listing)
    need = MIN_FREE_BYTES + kept * checkpoint + placing
    free = ready.disk_free
    if free is None:
        raise node.fail(f"free disk under {node.facts.root} unknown",
                        "check that the node's root is readable")
    if free < need:
        model = (f", {placing / GB:.2f} GB of the base model and data to place"
                 if cluster.target.placed else "")
        raise node.fail(f"{free / GB:.1f} GB free under {node.facts.root}, "
                        f"{job.path.name} needs {need / GB:.1f} GB ({kept} checkpoints of "
                        f"{checkpoint / GB:.2f} GB{model}, {MIN_FREE_BYTES / GB:.0f} GB "
                        "for logs)", "free disk space there, or lower train.keep")


@when(_planned_job)
def check_memory(node, cluster):
    """One rank of the job fits this host's memory (the plan of ``mlxops plan``: some
    micro-batch, with gradient checkpointing if need be), with the largest share of the
    global batch the job's ``balance:`` may give a rank there. On a Mac the budget is the
    recommended working set the node's MLX reports now (its ``ready`` answer)."""
    job = cluster.target.job
    memory = node.facts.memory_bytes
    if not memory:
        raise node.fail("memory size unknown (the facts did not say)", "check the node")
    ready = node.need(node.ready, NODE_ANSWER)
    share = largest_share(job, cluster.target.planned, node.name)
    planner = cluster.target.planner
    plan = planner.memory(memory, cluster.target.world, ranks_per_node=node.host.slots,
                          per_rank=share, working_set=ready.working_set)
    if not plan.fits:
        unit = planner.unit
        taking = f", {share} {unit} a step under balance" if share else ""
        usable = ("of MLX's recommended working set" if plan.budget_from == "working set"
                  else f"of {memory / GB:.0f} GB")
        raise node.fail(f"one rank of {job.path.name} needs {plan.total_bytes / GB:.1f} GB "
                        f"even at micro-batch 1 with gradient checkpointing, "
                        f"{plan.budget_bytes / GB:.1f} GB usable ({usable}, "
                        f"{node.host.slots} ranks{taking})",
                        f"a smaller model, fewer mlxops_slots or more nodes "
                        f"(mlxops plan {job.path.name})")


@when(lambda cluster, node: bool(cluster.target.ports.get(node.name)))
def check_ring_ports(node, cluster):
    """The host's ring ports (the job's, else mlx.launch's from 32323) are free on its
    ``mlxops_ip``."""
    ready = node.need(node.ready, NODE_ANSWER)
    if ready.ports_busy:
        ports = ", ".join(map(str, ready.ports_busy))
        plural = "s" if len(ready.ports_busy) > 1 else ""
        job = cluster.target.job
        fix = "stop what holds them (another job? mlxops status)"
        if job is not None:
            fix += f", or set another port: in {job.path.name}"
        raise node.fail(f"ring port{plural} {ports} on {node.host.ip} in use", fix)


def check_leftover_ranks(node):
    """No process of any job (a rank, or an mpi job's mpirun) still runs on the host."""
    ready = node.need(node.ready, NODE_ANSWER)
    if not ready.running:
        return
    jobs: dict[str, list[str]] = {}
    for r in ready.running:
        what = "mpirun" if r.rank == protocol.LAUNCHER else f"rank {r.rank}"
        jobs.setdefault(r.job, []).append(f"{what} (pid {r.pid})")
    found = "; ".join(f"job {job}: {', '.join(ps)} still running" for job, ps in jobs.items())
    raise node.fail(found, "; ".join(f"mlxops stop {job}" for job in jobs))


def check_clock(node):
    """The host's clock is within MAX_CLOCK_SKEW of the controller's."""
    node.need(node.ready, NODE_ANSWER)
    offset, uncertainty = node.clock
    if abs(offset) - uncertainty > MAX_CLOCK_SKEW:
        raise node.fail(f"clock {offset:+.1f} s off the controller's "
                        f"(limit {MAX_CLOCK_SKEW:g} s)",
                        "turn on network time (System Settings > General > Date & Time)")
