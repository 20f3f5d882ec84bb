"""Node-side helpers of mlxops jobs, run on each node as ``python -m mlxops.node ...``.

Standard library only: this package is synced to nodes next to the trainer and runs under
the node's interpreter. Every command prints one JSON document on stdout, which the
controller parses (mlxops.jobs.remote builds the command lines and reads the answers).

Run directory of a job on a node (``<mlxops_root>/runs/<name>/``)::

    rank-<r>.sh      the rank's start script (environment + interpreter + trainer)
    rank-<r>.pid     pid of the rank's session leader = its process group id
    rank-<r>.log     stdout and stderr of the rank
    rank-<r>.exit    the rank's exit code, written when it ends by itself
    progress/rank-<r>.json   the trainer's heartbeat (step, loss, time)
    stopped          present when mlxops stopped the job on purpose
    launcher.sh      mpi jobs, first host only: mpirun of every rank (its .pid/.log/.exit
                     like a rank's); mpirun starts the rank scripts, which then write their
                     own rank-<r>.pid (a plain pid, not necessarily a group leader)
"""
