"""The ``facts`` task: what a node is, gathered with ONE remote command per host.

pyinfra style: :func:`facts_script` builds one POSIX ``sh`` script (constant text plus
quoted values) that prints labelled sections; small pure parsers turn each section into
values; :func:`build_facts` assembles them once into the record every reader uses,
:class:`~mlxops.hostfacts.HostFacts` (its fields are documented there and in
docs/formats.md). The venv and the Mac's kernel state are read here too, so that later
tasks need no round trip of their own; the later tasks' own reads (a managed file, the
synced code's manifest: :attr:`TaskSpec.read <mlxops.tasks.base.TaskSpec>`) are taken along
in the same command (:func:`~mlxops.tasks.base.reads_script`), so a host with nothing to
change costs one round trip for the whole play.

Facts are cached on the controller in ``controller_home()/facts/<host>.json``, written and
read through the record's JSON form (one decoder).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mlxops import macnet, shell
from mlxops.hostfacts import FactsError, HostFacts, Interpreter, MacState, decode
from mlxops.node.protocol.layout import VENV_PYTHON
from mlxops.paths import controller_home
from mlxops.tasks.base import (
    MARK,
    Outcome,
    Prefetched,
    PythonRead,
    TaskContext,
    python_reads_code,
    read_answers,
    reads_script,
    task,
)

# Runs under the node's interpreter: its version and the mlx it imports (import, not
# package metadata: the test is "does mlx.core load", and it is as fast here), and that
# mlx's recommended GPU working set, the memory plan's budget on a Mac (read as
# mlxops/node/memory.py reads it; this probe runs before the node has mlxops' code); and the
# mlx-lm installed, by its package metadata (importing it would load transformers: seconds):
# the version in the name of its ``mlx_lm-X.Y.Z.dist-info`` directory on sys.path, as pip
# (and an editable install) writes it; ``importlib.metadata`` only where the directory has
# no version in its name (an ``.egg-info``): it imports the email parser and reads every
# distribution's metadata, 40 ms of CPU a node where the listing takes under one.
PROBE = (
    "import os, sys\n"
    "v = '%d.%d.%d' % sys.version_info[:3]\n"
    "w = None\n"
    "lm = None\n"
    "def _lm():\n"
    "    for d in sys.path:\n"
    "        try:\n"
    "            names = os.listdir(d or '.')\n"
    "        except OSError:\n"
    "            continue\n"
    "        for n in names:\n"
    "            base, _, ext = n.rpartition('.')\n"
    "            name, _, ver = base.partition('-')\n"
    "            if ext in ('dist-info', 'egg-info') and \\\n"
    "                    name.lower().replace('-', '_') == 'mlx_lm':\n"
    "                if ver:\n"
    "                    return ver.split('-')[0]\n"
    "                from importlib import metadata\n"
    "                return metadata.version('mlx-lm')\n"
    "try:\n"
    "    lm = _lm()\n"
    "except Exception:\n"
    "    pass\n"
    "try:\n"
    "    import mlx.core as mx\n"
    "    m = str(mx.__version__)\n"
    "except Exception:\n"
    "    m = None\n"
    "try:\n"
    "    info = mx.device_info() if hasattr(mx, 'device_info') else mx.metal.device_info()\n"
    "    w = int(info.get('max_recommended_working_set_size') or 0) or None\n"
    "except Exception:\n"
    "    pass\n"
    "def j(x):\n"
    "    if x is None or isinstance(x, int):\n"
    "        return 'null' if x is None else str(x)\n"
    "    return '\"%s\"' % ''.join(c if ' ' <= c <= '~' and c not in '\"\\\\' else\n"
    "                           '\\\\u%04x' % min(ord(c), 0xfffd) for c in x)\n"
    "print('{\"version\": %s, \"mlx\": %s, \"working_set\": %s, \"mlx_lm\": %s}'\n"
    "      % (j(v), j(m), j(w), j(lm)))\n"
)

# The constant part of the script. `$py`, `$root` and `$venv` are set before it from quoted
# values. Every process it starts costs the node CPU, so it starts few: one ``uname`` for
# three fields (POSIX prints them in the order s n m; a node name has no space), the system
# kept in ``$mlxops_os`` (the branch, reads); Linux's /proc and /sys read by the shell's own
# ``read``, not grep/cat/getconf (online CPUs counted from the ranges as glibc counts them).
_BODY = r"""
probe() { p=$(command -v "$1" 2>/dev/null) || return 0
  case "$p" in /*) ;; *) p="$PWD/$p" ;; esac
  printf '%s\n' "$p"; "$p" -c "$2" 2>/dev/null; }
mlxops_u=$(uname -s -n -m 2>/dev/null); mlxops_os=${mlxops_u%% *}
mlxops_arch=${mlxops_u##* }; mlxops_u=${mlxops_u#* }
echo '@@mlxops:uname'; printf '%s\n' "$mlxops_os" "$mlxops_arch" "${mlxops_u% *}"
echo '@@mlxops:home'; printf '%s\n' "$HOME"
echo '@@mlxops:python'; probe "$py" "$PROBE$PYREADS"
echo '@@mlxops:venv'; [ -x "$root/$venv" ] && probe "$root/$venv" "$PROBE"
echo '@@mlxops:df'; df -Pk "$HOME" 2>/dev/null
if [ "$mlxops_os" = Darwin ]; then
  echo '@@mlxops:sw_vers'; sw_vers 2>/dev/null
  echo '@@mlxops:sysctl'; sysctl hw.memsize hw.ncpu hw.perflevel0.physicalcpu \
    machdep.cpu.brand_string iogpu.wired_limit_mb 2>/dev/null
  echo '@@mlxops:ioreg'; ioreg -rd1 -c AGXAccelerator 2>/dev/null | grep gpu-core-count
  echo '@@mlxops:ifconfig'; ifconfig 2>/dev/null
  echo '@@mlxops:pmset'; pmset -g 2>/dev/null
@MACNET@else
  echo '@@mlxops:meminfo'
  while IFS= read -r l; do
    case "$l" in MemTotal:*) printf '%s\n' "$l"; break ;; esac
  done < /proc/meminfo
  echo '@@mlxops:cgroupmem'
  while IFS=: read -r hid ctl cg; do
    case "$ctl" in
      '') f="/sys/fs/cgroup$cg/memory.max" ;;
      memory|memory,*|*,memory|*,memory,*) f="/sys/fs/cgroup/memory$cg/memory.limit_in_bytes" ;;
      *) continue ;;
    esac
    if [ -r "$f" ] && IFS= read -r l < "$f"; then printf '%s\n' "$l"; fi
  done < /proc/self/cgroup
  echo '@@mlxops:nproc'
  f=/sys/devices/system/cpu/online
  if [ -r "$f" ] && IFS= read -r l < "$f"; then
    n=0
    while [ -n "$l" ]; do
      r=${l%%,*}; l=${l#"$r"}; l=${l#,}
      case "$r" in *-*) n=$((n + ${r#*-} - ${r%-*} + 1)) ;; *) n=$((n + 1)) ;; esac
    done
    echo "$n"
  else getconf _NPROCESSORS_ONLN; fi
  echo '@@mlxops:cpuinfo'
  while IFS= read -r l; do
    case "$l" in 'model name'*) printf '%s\n' "$l"; break ;; esac
  done < /proc/cpuinfo
  echo '@@mlxops:ip'; ip -4 -o addr show 2>/dev/null
fi
"""
_BODY = _BODY.replace("@MACNET@", macnet.SCRIPT.lstrip("\n"))
def facts_script(python: str, root: str,
                 reads: Mapping[str, str | PythonRead] | None = None) -> str:
    """The one command that gathers every fact (``python``: mlxops_python, ``root``: the
    node path mlxops_root, ``~/`` kept for the node to expand), and runs ``reads``: the
    Python ones in the interpreter that probes ``python``, the others after the facts."""
    reads = reads or {}
    in_python = {k: r for k, r in reads.items() if isinstance(r, PythonRead)}
    in_shell = {k: r for k, r in reads.items() if not isinstance(r, PythonRead)}
    return (f"py={shell.quote(python)}; root={shell.path_word(root)}; "
            f"venv={shell.quote(VENV_PYTHON)}; PROBE={shell.quote(PROBE)}; "
            f"PYREADS={shell.quote(python_reads_code(in_python))}\n"
            + _BODY + reads_script(in_shell) + "exit 0\n")


# --- parsers: text in, values out ----------------------------------------------------------


def split_sections(stdout: str) -> dict[str, str]:
    """``@@mlxops:name`` lines start sections; returns ``{name: text}``."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in stdout.splitlines():
        if line.startswith(MARK):
            current = sections.setdefault(line[len(MARK):].strip(), [])
        elif current is not None:
            current.append(line)
    return {name: "\n".join(lines) for name, lines in sections.items()}


def parse_key_values(text: str, sep: str = ":") -> dict[str, str]:
    """``key: value`` lines (sw_vers, sysctl, /proc/meminfo, cpuinfo) as a dict."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, found, value = line.partition(sep)
        if found:
            out[key.strip()] = value.strip()
    return out


def parse_probe(text: str) -> Interpreter | None:
    """The interpreter section: its absolute path, then the probe's JSON line."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return None
    path = lines[0].strip()
    for line in lines[1:]:
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict):  # the PROBE's own line: the rest of an Interpreter
            try:
                return decode(Interpreter, {**data, "path": path}, "facts.python")
            except FactsError:
                continue
    return Interpreter(path=path, version=None, mlx=None)


def parse_df(text: str) -> int | None:
    """``df -Pk``: free KiB of the filesystem, column 4 of the last line."""
    lines = text.strip().splitlines()
    if len(lines) < 2:
        return None
    fields = lines[-1].split()
    return int(fields[3]) * 1024 if len(fields) >= 4 and fields[3].isdigit() else None


def parse_ifconfig(text: str) -> tuple[dict[str, list[str]], dict[str, dict[str, Any]]]:
    """macOS ``ifconfig``: ``({iface: [ipv4...]}, {iface: {"up", "active", "members"}})``."""
    addrs: dict[str, list[str]] = {}
    info: dict[str, dict[str, Any]] = {}
    name = None
    for line in text.splitlines():
        head = re.match(r"^([A-Za-z0-9_.-]+): flags=\w+<([^>]*)>", line)
        if head:
            name = head.group(1)
            info[name] = {"up": "UP" in head.group(2).split(","), "active": None, "members": []}
            continue
        if name is None:
            continue
        words = line.split()
        if not words:
            continue
        if words[0] == "inet" and len(words) > 1:
            addrs.setdefault(name, []).append(words[1])
        elif words[0] == "status:" and len(words) > 1:
            info[name]["active"] = words[1] == "active"
        elif words[0] == "member:" and len(words) > 1:
            info[name]["members"].append(words[1])
    return addrs, info


def parse_ip_addr(text: str) -> dict[str, list[str]]:
    """Linux ``ip -4 -o addr show``: ``{iface: [ipv4...]}``."""
    addrs: dict[str, list[str]] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[2] == "inet":
            addrs.setdefault(fields[1], []).append(fields[3].split("/")[0])
    return addrs


def parse_cgroup_memory(text: str) -> int | None:
    """The lowest memory limit of the cgroups the login shell is in (cgroup v2's
    ``memory.max``, v1's ``memory.limit_in_bytes``: one number a line, or ``max``); None
    without one. On Linux a node in a memory cgroup (a container, a sandbox node made a
    small Mac) has that much memory, whatever /proc/meminfo says of the machine."""
    limits = [int(v) for v in text.split() if v.isdigit()]
    return min(limits) if limits else None


def parse_gpu_cores(text: str) -> int | None:
    """``ioreg -rd1 -c AGXAccelerator``: the ``"gpu-core-count" = 38`` property."""
    match = re.search(r'"gpu-core-count"\s*=\s*(\d+)', text)
    return int(match.group(1)) if match else None


def parse_pmset_sleep(text: str) -> int | None:
    """``pmset -g``: the system ``sleep`` minutes (0 = never sleeps)."""
    match = re.search(r"^\s*sleep\s+(\d+)", text, re.MULTILINE)
    return int(match.group(1)) if match else None


def _int(value: Any) -> int | None:
    try:
        return int(str(value).split()[0])
    except (ValueError, IndexError):
        return None


def absolute_root(root: str, home: str) -> str:
    """mlxops_root as the node sees it: ``~`` is its home, relative means under the home."""
    if root == "~":
        return home
    if root.startswith("~/"):
        return f"{home.rstrip('/')}/{root[2:]}"
    if root.startswith("/"):
        return root
    return f"{home.rstrip('/')}/{root}"


def build_facts(sections: Mapping[str, str], root: str) -> HostFacts:
    """Parse the script's sections into the facts record (pure)."""
    uname = sections.get("uname", "").splitlines() + ["", "", ""]
    system, arch, hostname = (w.strip() or None for w in uname[:3])
    home = sections.get("home", "").strip()
    facts = HostFacts(
        system=system, hostname=hostname, arch=arch,
        macos_version=None, macos_build=None, chip=None,
        memory_bytes=None, cpu_cores=None, perf_cores=None, gpu_cores=None,
        python=parse_probe(sections.get("python", "")) or Interpreter.none(),
        venv=parse_probe(sections.get("venv", "")),
        interfaces={},
        disk_free_bytes=parse_df(sections.get("df", "")),
        root=absolute_root(root, home) if home else None,
        macos=None,
    )
    if system == "Darwin":
        sw = parse_key_values(sections.get("sw_vers", ""))
        sysctl = parse_key_values(sections.get("sysctl", ""))
        addrs, ifaces = parse_ifconfig(sections.get("ifconfig", ""))
        bridge = ifaces.get("bridge0")
        facts.macos_version = sw.get("ProductVersion")
        facts.macos_build = sw.get("BuildVersion")
        facts.chip = sysctl.get("machdep.cpu.brand_string")
        facts.memory_bytes = _int(sysctl.get("hw.memsize"))
        facts.cpu_cores = _int(sysctl.get("hw.ncpu"))
        facts.perf_cores = _int(sysctl.get("hw.perflevel0.physicalcpu"))
        facts.gpu_cores = parse_gpu_cores(sections.get("ioreg", ""))
        facts.interfaces = addrs
        facts.macos = MacState(
            wired_limit_mb=_int(sysctl.get("iogpu.wired_limit_mb")),
            sleep=parse_pmset_sleep(sections.get("pmset", "")),
            # Thunderbolt Bridge is bridge0 over the Thunderbolt ports: when it is up
            # it holds the ports that jaccl (RDMA over Thunderbolt) needs to itself.
            thunderbolt_bridge_up=bool(bridge and bridge["up"]
                                       and bridge["active"] is not False),
            bridge_members=list(bridge["members"]) if bridge else [],
            hardware_ports=macnet.parse_hardware_ports(sections.get("hardwareports", "")),
        )
        facts.rdma = macnet.rdma_state(sections)
    else:
        mem_kib = _int(parse_key_values(sections.get("meminfo", "")).get("MemTotal"))
        facts.chip = parse_key_values(sections.get("cpuinfo", "")).get("model name")
        facts.memory_bytes = mem_kib * 1024 if mem_kib is not None else None
        limit = parse_cgroup_memory(sections.get("cgroupmem", ""))
        if limit is not None and (facts.memory_bytes is None or limit < facts.memory_bytes):
            facts.memory_bytes = limit   # a memory cgroup's limit is the node's memory
        facts.cpu_cores = _int(sections.get("nproc", "").strip())
        facts.interfaces = parse_ip_addr(sections.get("ip", ""))
    return facts


# --- the controller's cache ---------------------------------------------------------------


def cache_path(host_name: str) -> Path:
    return controller_home() / "facts" / f"{host_name}.json"


def save_facts(host_name: str, facts: HostFacts) -> Path:
    """Write one host's facts to the cache (atomically: readers never see half a file)."""
    path = cache_path(host_name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(facts.to_json(), indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


def load_cached_facts(host_name: str) -> HostFacts | None:
    """The facts the last provision gathered for a host, or None. A cache that is not
    JSON or does not fit the record counts as none: the callers ask the host instead."""
    try:
        return HostFacts.from_json(json.loads(cache_path(host_name).read_text()))
    except (FileNotFoundError, ValueError):  # FactsError is a ValueError
        return None


# --- the task -----------------------------------------------------------------------------


def ask_facts(conn, host) -> HostFacts:
    """Run the facts script on one host; raises RuntimeError when it does not answer."""
    return gather(conn, host, {})[0]


def gather(conn, host, reads: Mapping[str, str | PythonRead]
           ) -> tuple[HostFacts, dict[str, Prefetched]]:
    """The facts of one host and what ``reads`` printed there, in one command."""
    result = conn.run(facts_script(host.python, host.root, reads), timeout=60)
    sections = split_sections(result.stdout)
    if "uname" not in sections:
        raise RuntimeError(f"gathering facts failed: {result.error_line()}")
    return build_facts(sections, host.root), read_answers(sections, reads)


@task("facts")
def facts_task(ctx: TaskContext, args: Mapping[str, Any]) -> Outcome:
    """Gather facts (read-only: the same under --check). The first command on a host, so
    it is also where SSH and its host key get verified."""
    try:
        facts, ctx.read_answers = gather(ctx.conn, ctx.host, ctx.pending_reads)
    except RuntimeError as exc:
        return Outcome.failed(str(exc))
    # Later tasks change the record in place (the python task's venv), so each host's
    # context and the play's cluster_facts hold the same object.
    ctx.facts = ctx.cluster_facts[ctx.host.name] = facts
    where = f"{facts.system} {facts.macos_version or ''}".strip()
    return Outcome.ok(f"{where}, python {facts.python.version} mlx {facts.python.mlx}")
