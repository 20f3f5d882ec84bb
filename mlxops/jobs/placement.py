"""Where each rank runs, and exactly what it is started with.

Ranks are numbered in inventory order, ``mlxops_slots`` consecutive ranks per host, and ring
ports are handed out like ``mlx.launch`` does (one per rank, consecutive from the first
port). Each rank gets the environment ``mlx.launch`` would give its backend (read from
``mlx/_distributed_utils/launch.py``): ``MLX_RANK`` and ``MLX_HOSTFILE`` for ring;
``MLX_JACCL_COORDINATOR``, ``MLX_IBV_DEVICES`` (and ``MLX_JACCL_RING``) for jaccl; plus the
managed ``env.sh``, the host's ``mlxops_env``, the job's ``env:`` and mlxops' own
``MLXOPS_*`` variables that the trainer reads.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from mlxops import shell


@dataclass(frozen=True)
class Rank:
    rank: int
    host: str          # inventory name
    ip: str            # address other ranks reach it at
    port: int
    local_rank: int    # index among the ranks on the same host

    def to_dict(self) -> dict:
        return {"rank": self.rank, "host": self.host, "ip": self.ip, "port": self.port,
                "local_rank": self.local_rank}


def place_ranks(hosts: Sequence, base_port: int) -> list[Rank]:
    ranks: list[Rank] = []
    for host in hosts:
        for local in range(host.slots):
            n = len(ranks)
            ranks.append(Rank(n, host.name, host.ip, base_port + n, local))
    return ranks


def ring_hostfile(ranks: Sequence[Rank]) -> str:
    """MLX_HOSTFILE for ring: a JSON list per rank of ``"ip:port"`` strings."""
    return json.dumps([[f"{r.ip}:{r.port}"] for r in ranks])


@dataclass(frozen=True)
class NodePaths:
    """Absolute paths on one node (the node resolved ``mlxops_root`` at launch)."""

    root: str
    name: str

    @property
    def code(self) -> str:
        return f"{self.root}/code"

    @property
    def run_dir(self) -> str:
        return f"{self.root}/runs/{self.name}"

    @property
    def env_file(self) -> str:
        return f"{self.root}/env.sh"

    def workdir(self) -> str:
        return f"{self.code}/jobs/{self.name}"


def rank_environment(*, backend: str, rank: Rank, ranks: Sequence[Rank], paths: NodePaths,
                     host_env: dict[str, str], job_env: dict[str, str],
                     resume: bool) -> dict[str, str]:
    """Environment of one rank, later entries winning (mlxops' own variables last)."""
    env: dict[str, str] = {}
    env.update(host_env)
    env.update(job_env)
    world = len(ranks)
    env.update({
        "MLX_RANK": str(rank.rank),
        "MLXOPS_WORLD_SIZE": str(world),
        "MLXOPS_LOCAL_RANK": str(rank.local_rank),
        "MLXOPS_BACKEND": backend,
        "MLXOPS_RUN_DIR": paths.run_dir,
        "MLXOPS_RESUME": "1" if resume else "0",
    })
    if world > 1:
        if backend == "ring":
            env["MLX_HOSTFILE"] = f"{paths.run_dir}/hostfile.json"
        elif backend in ("jaccl", "jaccl-ring"):
            env["MLX_JACCL_COORDINATOR"] = f"{ranks[0].ip}:{ranks[0].port}"
            env["MLX_IBV_DEVICES"] = f"{paths.run_dir}/ibv_devices.json"
            if backend == "jaccl-ring":
                env["MLX_JACCL_RING"] = "1"
    return env


def rank_script(*, env: dict[str, str], argv: Sequence[str], paths: NodePaths, cwd: str,
                rank: int) -> str:
    """The script a rank runs, detached: managed env, then its own, then the program.

    It does not ``exec`` the program: it stays to record the exit code, which is how the
    watchdog tells a rank that finished or failed from one that vanished.
    """
    exit_file = f"{paths.run_dir}/rank-{rank}.exit"
    lines = [
        f"# rank {rank} of job {paths.name}: written by mlxops, started by mlxops.node spawn",
        f"if [ -f {shell.quote(paths.env_file)} ]; then . {shell.quote(paths.env_file)}; fi",
        shell.export_lines(env).rstrip("\n"),
        f"export PYTHONPATH={shell.quote(paths.code)}${{PYTHONPATH:+:$PYTHONPATH}}",
        f"cd {shell.quote(cwd)} || exit 1",
        shell.join(argv),
        "code=$?",
        f'printf "%s\\n" "$code" > {shell.quote(exit_file + ".tmp")} && '
        f"mv {shell.quote(exit_file + '.tmp')} {shell.quote(exit_file)}",
        'exit "$code"',
    ]
    return "\n".join(line for line in lines if line) + "\n"
