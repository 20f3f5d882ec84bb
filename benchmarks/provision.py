"""Benchmark: ``mlxops provision`` against ansible-playbook and pyinfra doing the same tasks.

On N sandbox nodes (default 16; needs root), each tool, in its own node directory:
facts, the env file, a check that the node's Python imports the pinned mlx, the two
hostfiles, the trainer code. Timed cold (directory removed first) then re-run; printed
side by side. Ansible and pyinfra are installed in this benchmark's own virtualenv
(``--tools-venv``, created on first use with pip), never in mlxops' environment.

    sudo .venv/bin/python benchmarks/provision.py --nodes 16 [--tools mlxops,pyinfra,ansible]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from mlxops.paths import trainer_dir
from mlxops.sandbox import Sandbox

ROOTS = {"mlxops": ".bench-mlxops", "ansible": ".bench-ansible", "pyinfra": ".bench-pyinfra"}
TOOLS_VENV = Path("/var/cache/mlxops-bench/venv")


def ensure_tools(venv: Path) -> Path:
    if not (venv / "bin" / "ansible-playbook").exists() or not (venv / "bin" / "pyinfra").exists():
        print(f"installing ansible-core and pyinfra into {venv} ...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check",
                        "ansible-core", "pyinfra"], check=True)
    return venv / "bin"


def clear_roots(box: Sandbox, tool: str) -> None:
    for node in box.nodes:
        shutil.rmtree(box.node_home(node) / ROOTS[tool], ignore_errors=True)


def timed(argv: list[str], env: dict | None = None, cwd: str | None = None) -> tuple[float, str]:
    t0 = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd)
    took = time.monotonic() - t0
    if proc.returncode != 0:
        sys.exit(f"{argv[0]} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                 f"{proc.stderr[-3000:]}")
    return took, proc.stdout


# --- mlxops --------------------------------------------------------------------------------


def run_mlxops(box: Sandbox, work: Path) -> list[tuple[float, int]]:
    doc = yaml.safe_load(box.inventory_path.read_text())
    doc["all"]["vars"]["mlxops_root"] = f"~/{ROOTS['mlxops']}"
    inv = work / "mlxops-inventory.yml"
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    env = {**os.environ, "MLXOPS_HOME": str(work / "mlxops-home")}
    argv = [sys.executable, "-m", "mlxops", "provision", str(inv), "--json"]
    runs = []
    for _ in range(2):
        took, out = timed(argv, env)
        changed = sum(h["changed"] for h in json.loads(out)["hosts"].values())
        runs.append((took, changed))
    return runs


def node_files(box: Sandbox) -> dict[str, dict[str, str]]:
    """What mlxops wrote (env.sh, hostfiles): the other tools write the same bytes."""
    out = {}
    for node in box.nodes:
        root = box.node_home(node) / ROOTS["mlxops"]
        out[node] = {"env": (root / "env.sh").read_text(),
                     "ring": (root / "hostfiles" / "ring.json").read_text(),
                     "mpi": (root / "hostfiles" / "mpi.txt").read_text()}
    return out


# --- ansible -------------------------------------------------------------------------------

ANSIBLE_PLAY = """\
- hosts: sandbox
  gather_facts: true
  vars: {root: "{{ ansible_env.HOME }}/%(root)s"}
  tasks:
    - name: root dir
      file: {path: "{{ root }}/code/mlxops", state: directory}
    - name: env file
      copy: {content: "{{ bench_env }}", dest: "{{ root }}/env.sh", mode: "0600"}
    - name: python imports the pinned mlx
      command:
        argv: ["{{ mlxops_python }}", "-c", "import mlx.core as mx; print(mx.__version__)"]
      register: mlx
      changed_when: false
      failed_when: mlx.stdout != "%(pin)s"
    - name: hostfiles dir
      file: {path: "{{ root }}/hostfiles", state: directory}
    - name: ring hostfile
      copy: {content: "{{ bench_ring }}", dest: "{{ root }}/hostfiles/ring.json"}
    - name: mpi hostfile
      copy: {content: "{{ bench_mpi }}", dest: "{{ root }}/hostfiles/mpi.txt"}
    - name: trainer code
      copy: {src: "%(trainer)s/", dest: "{{ root }}/code/mlxops/trainer/"}
"""


def run_ansible(box: Sandbox, work: Path, bin_dir: Path, files, pin: str
                ) -> list[tuple[float, int]]:
    doc = yaml.safe_load(box.inventory_path.read_text())
    doc["all"]["vars"]["ansible_python_interpreter"] = "/usr/bin/python3"
    for node, host in doc["all"]["children"]["sandbox"]["hosts"].items():
        host.update(bench_env=files[node]["env"], bench_ring=files[node]["ring"],
                    bench_mpi=files[node]["mpi"])
    (work / "ansible-inventory.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    (work / "play.yml").write_text(ANSIBLE_PLAY % {"root": ROOTS["ansible"], "pin": pin,
                                                   "trainer": trainer_dir()})
    env = {**os.environ, "ANSIBLE_PIPELINING": "1", "ANSIBLE_FORKS": str(len(box.nodes)),
           "ANSIBLE_HOST_KEY_CHECKING": "1", "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_SSH_CONTROL_PATH_DIR": str(work / "cp"), "ANSIBLE_LOCAL_TEMP": str(work)}
    argv = [str(bin_dir / "ansible-playbook"), "-i", str(work / "ansible-inventory.yml"),
            str(work / "play.yml")]
    runs = []
    for _ in range(2):
        took, out = timed(argv, env)
        changed = sum(int(n) for n in re.findall(r"changed=(\d+)", out))
        runs.append((took, changed))
    return runs


# --- pyinfra -------------------------------------------------------------------------------

PYINFRA_DEPLOY = """\
from io import StringIO
from pyinfra import host
from pyinfra.facts.server import Arch, Hostname, Os
from pyinfra.operations import files, server

host.get_fact(Os), host.get_fact(Arch), host.get_fact(Hostname)
root = %(root)r
files.directory(name="root", path=root)
files.put(name="env file", src=StringIO(host.data.bench_env), dest=root + "/env.sh",
          mode="600")
server.shell(name="python imports the pinned mlx", commands=[
    host.data.python + " -c 'import mlx.core as mx; assert mx.__version__ == \\"%(pin)s\\"'"])
files.directory(name="hostfiles dir", path=root + "/hostfiles")
files.put(name="ring", src=StringIO(host.data.bench_ring), dest=root + "/hostfiles/ring.json")
files.put(name="mpi", src=StringIO(host.data.bench_mpi), dest=root + "/hostfiles/mpi.txt")
files.sync(name="trainer code", src=%(trainer)r, dest=root + "/code/mlxops/trainer")
"""


def run_pyinfra(box: Sandbox, work: Path, bin_dir: Path, files, pin: str
                ) -> list[tuple[float, int | None]]:
    hosts = [(box.ip(n), {"ssh_user": box.user, "ssh_key": str(box.key_path),
                          "ssh_known_hosts_file": str(box.known_hosts_path),
                          "ssh_strict_host_key_checking": "yes", "python": box.python,
                          "bench_env": files[n]["env"], "bench_ring": files[n]["ring"],
                          "bench_mpi": files[n]["mpi"]}) for n in box.nodes]
    (work / "pyinfra_inventory.py").write_text(f"sandbox = {hosts!r}\n")
    (work / "deploy.py").write_text(PYINFRA_DEPLOY % {"root": ROOTS["pyinfra"], "pin": pin,
                                                      "trainer": str(trainer_dir())})
    argv = [str(bin_dir / "pyinfra"), "-y", "--parallel", str(len(box.nodes)),
            "pyinfra_inventory.py", "deploy.py"]
    return [(timed(argv, cwd=str(work))[0], None) for _ in range(2)]


# --- main ----------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--tools", default="mlxops,pyinfra,ansible")
    parser.add_argument("--tools-venv", type=Path, default=TOOLS_VENV)
    parser.add_argument("--subnet", default="10.244.9.0/24")
    opts = parser.parse_args()
    tools = [t.strip() for t in opts.tools.split(",")]
    from importlib.metadata import version
    pin = version("mlx")

    bin_dir = ensure_tools(opts.tools_venv) if set(tools) - {"mlxops"} else None
    work = Path(tempfile.mkdtemp(prefix="mlxops-bench-"))
    work.chmod(0o755)
    box = Sandbox(work / "sandbox", prefix="mxbench", subnet=opts.subnet)
    print(f"starting {opts.nodes} sandbox nodes ...", file=sys.stderr)
    box.up(opts.nodes)
    results: dict[str, list[tuple[float, int | None]]] = {}
    try:
        clear_roots(box, "mlxops")
        results["mlxops"] = run_mlxops(box, work)  # always: the others copy its files
        files = node_files(box)
        for tool in tools:
            if tool == "mlxops":
                continue
            print(f"running {tool} ...", file=sys.stderr)
            clear_roots(box, tool)
            runner = run_ansible if tool == "ansible" else run_pyinfra
            results[tool] = runner(box, work, bin_dir, files, pin)
    finally:
        box.down()
        shutil.rmtree(work, ignore_errors=True)

    print(f"\nprovision, {opts.nodes} sandbox nodes, {os.cpu_count()} cores")
    print(f"{'tool':<10} {'cold (s)':>9} {'re-run (s)':>11} {'re-run changed':>15}")
    for tool, ((cold, _), (rerun, changed)) in results.items():
        shown = "-" if changed is None else str(changed)
        print(f"{tool:<10} {cold:>9.2f} {rerun:>11.2f} {shown:>15}")


if __name__ == "__main__":
    main()
