"""Node-side helpers of mlxops jobs, run on each node as ``python -m mlxops.node ...``.

Standard library only: this package is synced to nodes next to the trainer and runs under
the node's interpreter. Every command prints one JSON document on stdout, which the
controller parses (:mod:`mlxops.transport.nodecmd` runs the commands and reads the answers).
The commands, their answers and the run directory they work in are defined once, in
:mod:`mlxops.node.protocol`, and written out for people in docs/node-protocol.md.

Modules: ``procs`` (the process table), ``rundir`` (reading the run directory),
``spawn``, ``status``, ``stop``, ``logs``, ``preflight``, and for ``mlxops check``
``ready`` and ``reach`` (one command each), ``ports``.
"""
