"""``mlxops bench``: latency, bandwidth and all-reduce figures of a cluster, and the best ring
order (docs/cli.md, ``mlxops bench``; the result file: docs/formats.md).

The controller's side: who measures with whom when (:mod:`~mlxops.bench.schedule`), the
phases over SSH (:mod:`~mlxops.bench.measure`, the node side is ``mlxops.node``'s bench
commands), the all-reduce sweep as an internal job (:mod:`~mlxops.bench.allreduce`), the
ring order (:mod:`~mlxops.bench.ring`), what to make of it all
(:mod:`~mlxops.bench.findings`) and the saved results (:mod:`~mlxops.bench.results`).
"""
