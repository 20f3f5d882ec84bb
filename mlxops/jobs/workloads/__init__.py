"""What a job runs, one type per kind (:mod:`.base`: the protocol; :mod:`.registry`: the
kinds). ``from mlxops.jobs.workloads import Workload, KINDS``."""

from mlxops.jobs.workloads.base import NodePlacement, Planner, RankPlan, Workload
from mlxops.jobs.workloads.registry import KINDS, from_record, section_of

__all__ = ["KINDS", "NodePlacement", "Planner", "RankPlan", "Workload", "from_record",
           "section_of"]
