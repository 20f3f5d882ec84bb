"""The macOS tools of a Mac-like sandbox node, one program under each tool's name.

``mlxops sandbox up --flavour macos`` copies this file to ``DIR/darwin/shim.py`` (its
first line made the node interpreter) and links ``DIR/darwin/bin/<tool>`` to it; that
directory comes first on the PATH of every SSH session of the node. The program answers
as the tool it is called as (``argv[0]``):

- ``uname``, ``sw_vers``, ``sysctl``, ``vm_stat``, ``ioreg``, ``pmset -g``: output recorded
  on a real Mac (``recorded/``, sources in ``recorded/README.md``). Two values are kept as
  state, in the node's own directory: ``iogpu.wired_limit_mb`` (``sysctl -w``) and the
  system ``sleep`` (``pmset -a sleep N``), so provision changes them and check reads them.
- ``networksetup -listallhardwareports``: recorded (which device is Wi-Fi, Thunderbolt).
- ``ifconfig``: the recorded interfaces of a Mac, with ``en0`` carrying the node's own
  address (it must route: the cluster talks over it).
- ``ps`` (BSD ``-o`` keywords) and ``stat -f`` (BSD formats): the node's real processes and
  files in the BSD tools' formats. The node has no ``/proc`` (an empty one is mounted over
  it); ``ps`` reads the real process table from where the sandbox moved it.
- ``sudo``: the node user has no real sudo, so ``sudo -n CMD`` runs CMD as the node user
  with a marker (``MLXOPS_SANDBOX_ROOT=1``) that ``sysctl -w`` and ``pmset`` take for
  root; without it they refuse, as macOS does for a user.

Standard library only: it runs under the node's interpreter, outside any package.

Longer than 400 lines because it is the one program every shimmed tool runs (``argv[0]``
picks the tool), copied to the node outside any package; RDMA's tools are already apart,
in macrdma.py beside it, and each further split is one more file for ``up`` to copy.
"""

from __future__ import annotations

import os
import re
import socket
import stat
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent   # DIR/darwin
sys.path.insert(0, str(HERE))            # macrdma.py beside it (up copies both)
import macrdma  # noqa: E402  (found where this program is, not in a package)

RECORDED = HERE / "recorded"
NODE = HERE / "node"                      # this node's own directory (a bind mount)
REAL_PROC = NODE / "proc"                 # the node's /proc, moved out of the way
ROOT_MARK = "MLXOPS_SANDBOX_ROOT"

WIRED_LIMIT = "iogpu.wired_limit_mb"
#: uname -m / -p of Apple silicon (recorded/README.md)
MACHINE, PROCESSOR = "arm64", "arm"


class ToolError(Exception):
    """A tool's own error: message on stderr, exit code."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


def _is_root(env: dict) -> bool:
    return env.get(ROOT_MARK) == "1"


# --- recorded values and the node's state ----------------------------------------------------


def recorded_sysctl(recorded: Path = RECORDED) -> dict[str, str]:
    values = {}
    for line in (recorded / "sysctl.txt").read_text().splitlines():
        name, sep, value = line.partition(": ")
        if sep:
            values[name] = value
    return values


def read_state(node: Path, name: str, default: str) -> str:
    try:
        return (node / name).read_text().strip() or default
    except OSError:
        return default


def write_state(node: Path, name: str, value: str) -> None:
    tmp = node / f".{name}.tmp"
    tmp.write_text(value + "\n")
    os.replace(tmp, node / name)


def sysctl_values(recorded: Path, node: Path) -> dict[str, str]:
    """Every name the node answers: the recorded ones, its own hostname, the state."""
    values = recorded_sysctl(recorded)
    values["kern.hostname"] = socket.gethostname()
    values[WIRED_LIMIT] = read_state(node, WIRED_LIMIT, "0")
    return values


# --- the tools -------------------------------------------------------------------------------


def uname(args: list[str], recorded: Path = RECORDED) -> str:
    values = recorded_sysctl(recorded)
    fields = {"s": values["kern.ostype"], "n": socket.gethostname(),
              "r": values["kern.osrelease"], "v": values["kern.version"],
              "m": MACHINE, "p": PROCESSOR}
    wanted = ""
    for arg in args or ["-s"]:
        if not re.fullmatch(r"-[amnprsv]+", arg):
            raise ToolError("usage: uname [-amnprsv]")
        wanted += "snrvm" if "a" in arg else arg[1:]
    return " ".join(fields[f] for f in "snrvmp" if f in wanted) + "\n"


def sw_vers(args: list[str], recorded: Path = RECORDED) -> str:
    values = recorded_sysctl(recorded)
    fields = {"-productName": ("ProductName", "macOS"),
              "-productVersion": ("ProductVersion", values["kern.osproductversion"]),
              "-buildVersion": ("BuildVersion", macrdma.build(values["kern.osversion"],
                                                              NODE))}
    if not args:
        return "".join(f"{name}:\t\t{value}\n" for name, value in fields.values())
    if len(args) == 1 and args[0] in fields:
        return fields[args[0]][1] + "\n"
    raise ToolError("usage: sw_vers [-productName|-productVersion|-buildVersion]")


def sysctl(args: list[str], env: dict, recorded: Path = RECORDED, node: Path = NODE
           ) -> tuple[str, str, int]:
    """``sysctl [-n] [-i] [-a] [-w] name[=value]...``: (stdout, stderr, exit code)."""
    values = sysctl_values(recorded, node)
    opts = set()
    names = []
    for arg in args:
        if re.fullmatch(r"-[aniw]+", arg):
            opts.update(arg[1:])
        else:
            names.append(arg)
    if "a" in opts:
        names = sorted(values)
    out, err, code = [], [], 0
    for name in names:
        if "=" in name:
            key, _, new = name.partition("=")
            if key not in values:
                err.append(f"sysctl: unknown oid '{key}'")
                code = 1
            elif key != WIRED_LIMIT:
                err.append(f"sysctl: oid '{key}' is read only")
                code = 1
            elif not _is_root(env):
                err.append(f"sysctl: {name}: Operation not permitted")
                code = 1
            elif not new.isdigit():
                err.append(f"sysctl: invalid integer '{new}'")
                code = 1
            else:
                write_state(node, key, str(int(new)))
                out.append(f"{key}: {values[key]} -> {int(new)}")
        elif name in values:
            out.append(values[name] if "n" in opts else f"{name}: {values[name]}")
        elif "i" not in opts:
            err.append(f"sysctl: unknown oid '{name}'")
            code = 1
    return "".join(line + "\n" for line in out), "".join(e + "\n" for e in err), code


_SLEEP_LINE = re.compile(r"^( sleep +)(\d+)(.*)$", re.MULTILINE)


def pmset(args: list[str], env: dict, recorded: Path = RECORDED, node: Path = NODE) -> str:
    """``pmset -g``: the recorded settings with ``sleep`` as this node has it;
    ``pmset -a|-b|-c sleep N``: keep N (as root only)."""
    text = (recorded / "pmset-g.txt").read_text()
    if args == ["-g"] or not args:
        recorded_sleep = _SLEEP_LINE.search(text).group(2)
        sleep = read_state(node, "sleep", recorded_sleep)
        # The recorded "(sleep prevented by ...)" belongs to the recorded value only.
        return _SLEEP_LINE.sub(lambda m: m.group(1) + sleep + (
            m.group(3) if sleep == recorded_sleep else ""), text)
    if args[0] in ("-a", "-b", "-c", "-u") and len(args) == 3 and args[1] == "sleep":
        if not _is_root(env):
            raise ToolError("pmset: must be run as root")
        if not args[2].isdigit():
            raise ToolError(f"pmset: bad value for sleep: {args[2]}")
        write_state(node, "sleep", str(int(args[2])))
        return ""
    raise ToolError("pmset (sandbox): only `pmset -g` and `pmset -a sleep N` are answered")


def ioreg(args: list[str], recorded: Path = RECORDED) -> str:
    """The recorded Apple GPU entry for its classes (``-c IOAccelerator``/``AGXAccelerator``),
    nothing for any other class."""
    wanted = args[args.index("-c") + 1] if "-c" in args[:-1] else None
    if wanted in ("IOAccelerator", "AGXAccelerator", "AGXAcceleratorG13X"):
        return (recorded / "ioreg-IOAccelerator.txt").read_text()
    return ""


def ifconfig(addresses: list[tuple[str, int]], mac: str, recorded: Path = RECORDED) -> str:
    """The recorded interfaces, en0 being the node's own wire (``addresses``: its IPv4
    addresses with prefix lengths, ``mac``: its hardware address)."""
    wired = (recorded / "ifconfig-wired.txt").read_text().splitlines()
    en0 = []
    for line in wired:
        words = line.split()
        if line.startswith("en2:"):
            en0.append("en0:" + line[len("en2:"):])
        elif words[0] == "ether":
            en0.append(line.replace(words[1], mac))
        elif words[0] == "inet6":
            continue   # the node's link has no IPv6 address of its own to show
        elif words[0] == "inet":
            indent = line[:len(line) - len(line.lstrip())]
            for ip, prefix in addresses:
                mask = (0xFFFFFFFF << (32 - prefix)) & 0xFFFFFFFF
                net = int.from_bytes(socket.inet_aton(ip), "big") | (~mask & 0xFFFFFFFF)
                en0.append(f"{indent}inet {ip} netmask 0x{mask:08x} broadcast "
                           f"{socket.inet_ntoa(net.to_bytes(4, 'big'))}")
        else:
            en0.append(line)
    return ((recorded / "ifconfig-head.txt").read_text() + "\n".join(en0) + "\n"
            + (recorded / "ifconfig-thunderbolt.txt").read_text()
            + macrdma.bridge_stanza(recorded, NODE))


def node_link() -> tuple[list[tuple[str, int]], str]:
    """The node's IPv4 addresses on en0 (iproute2 reads netlink, not /proc) and MAC."""
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "dev", "en0"],
                         capture_output=True, text=True, check=False).stdout
    addresses = []
    for line in out.splitlines():
        words = line.split()
        if "inet" in words:
            ip, _, prefix = words[words.index("inet") + 1].partition("/")
            addresses.append((ip, int(prefix or 32)))
    try:
        mac = Path("/sys/class/net/en0/address").read_text().strip()
    except OSError:
        mac = "00:00:00:00:00:00"
    return addresses, mac


# --- ps: the real process table in BSD ps's format -------------------------------------------

#: BSD ps's process states for Linux's (D: uninterruptible wait is U on BSD; I: idle).
_STATE = {"R": "R", "S": "S", "D": "U", "Z": "Z", "T": "T", "t": "T", "I": "I", "X": "Z"}
_KEYWORDS = ("pid", "ppid", "pgid", "stat", "state", "comm", "command", "args", "uid",
             "user", "rss")
_RIGHT = {"pid", "ppid", "pgid", "uid", "rss"}


def proc_row(proc: Path, pid: int) -> dict[str, str] | None:
    """One process's BSD ps fields from a Linux proc directory; None if it is gone."""
    base = proc / str(pid)
    try:
        raw = (base / "stat").read_text()
        status = (base / "status").read_text()
        cmdline = (base / "cmdline").read_bytes()
    except OSError:
        return None
    head, tail = raw.rsplit(")", 1)
    name = head.split("(", 1)[1]
    fields = tail.split()
    state, ppid, pgid, session, tty, tpgid = (fields[0], fields[1], fields[2], fields[3],
                                              fields[4], fields[5])
    flag = _STATE.get(state, state) + ("s" if session == str(pid) else "") + (
        "+" if tty != "0" and tpgid == pgid else "")
    uid = re.search(r"^Uid:\s+(\d+)", status, re.M).group(1)
    rss = re.search(r"^VmRSS:\s+(\d+)", status, re.M)
    try:   # BSD ps's comm is the executable's path; another user's exe is unreadable
        comm = os.readlink(base / "exe")
    except OSError:
        comm = name
    args = cmdline.replace(b"\0", b" ").decode(errors="replace").strip() or f"({name})"
    try:
        import pwd
        user = pwd.getpwuid(int(uid)).pw_name
    except (KeyError, ImportError):
        user = uid
    return {"pid": str(pid), "ppid": ppid, "pgid": pgid, "stat": flag, "state": flag,
            "comm": comm, "command": args, "args": args, "uid": uid, "user": user,
            "rss": rss.group(1) if rss else "0"}


def ps(args: list[str], proc: Path | None = None) -> str:
    """``ps -A|-e|-p PIDS -o KEYWORD[=HEADER],...`` as BSD ps prints them (``proc``: the
    real /proc, by default where the sandbox moved it)."""
    proc = proc or REAL_PROC
    columns: list[tuple[str, str]] = []
    pids: list[int] | None = None
    want_all = False
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("-A", "-e", "-ax", "-axww", "-ww"):
            want_all = True
        elif arg in ("-o", "-p") and i + 1 < len(args):
            i += 1
            if arg == "-p":
                pids = [int(p) for p in re.split(r"[,\s]+", args[i]) if p]
            else:
                for word in re.split(r"[,\s]+", args[i]):
                    key, sep, header = word.partition("=")
                    if key not in _KEYWORDS:
                        raise ToolError(f"ps: {key}: keyword not found")
                    columns.append((key, header if sep else key.upper()))
        else:
            raise ToolError(f"ps (sandbox): option {arg} is not answered")
        i += 1
    if not columns:
        columns = [("pid", "PID"), ("stat", "STAT"), ("command", "COMMAND")]
    if pids is None:
        pids = sorted(int(p.name) for p in proc.iterdir() if p.name.isdigit()) \
            if want_all else [os.getpid()]
    rows = [r for r in (proc_row(proc, pid) for pid in pids) if r is not None]
    widths = {k: max([len(h)] + [len(r[k]) for r in rows]) for k, h in columns}
    lines = []
    if any(h for _, h in columns):
        lines.append(_format(columns, {k: h for k, h in columns}, widths))
    lines += [_format(columns, row, widths) for row in rows]
    return "".join(line + "\n" for line in lines)


def _format(columns: list[tuple[str, str]], row: dict[str, str], widths: dict) -> str:
    cells = []
    for n, (key, _) in enumerate(columns):
        last = n == len(columns) - 1
        value = row[key]
        cells.append(value.rjust(widths[key]) if key in _RIGHT
                     else value if last else value.ljust(widths[key]))
    return " ".join(cells)


# --- stat -f: BSD stat's format --------------------------------------------------------------


def bsd_stat(args: list[str]) -> str:
    """``stat -f FORMAT FILE...`` (``%p``/``%Lp``/``%Mp``/``%Hp`` mode, ``%z`` size, ``%m``
    mtime, ``%u``/``%g`` owner, ``%N`` name, ``%l`` links); GNU's ``-c`` fails as on a Mac."""
    if len(args) < 3 or args[0] != "-f":
        raise ToolError(f"stat: illegal option -- {args[0][1:2] if args else ''}\n"
                        "usage: stat [-FLnq] [-f format | -l | -r | -s | -x] [-t timefmt] "
                        "[file ...]")
    fmt, files = args[1], args[2:]
    out = []
    for name in files:
        try:
            st = os.stat(name)
        except OSError as exc:
            raise ToolError(f"stat: {name}: stat: {exc.strerror}") from None
        out.append(re.sub(r"%([LMH]?)([pzmugNl%])",
                          lambda m, st=st, name=name: _stat_field(st, name, *m.groups()), fmt))
    return "".join(line + "\n" for line in out)


def _stat_field(st: os.stat_result, name: str, part: str, field: str) -> str:
    if field == "p":
        mode = {"L": st.st_mode & 0o777, "M": (st.st_mode >> 9) & 0o7,
                "H": stat.S_IFMT(st.st_mode) >> 12}.get(part, st.st_mode)
        return f"{mode:o}"
    return {"z": str(st.st_size), "m": str(int(st.st_mtime)), "u": str(st.st_uid),
            "g": str(st.st_gid), "N": name, "l": str(st.st_nlink), "%": "%"}[field]


# --- sudo ------------------------------------------------------------------------------------


def sudo(args: list[str], env: dict) -> None:
    """``sudo [-n] [--] CMD ...``: CMD as this (node) user, marked as root for the shims."""
    while args and args[0] in ("-n", "--"):
        args = args[1:]
    if not args or args[0].startswith("-"):
        raise ToolError("sudo (sandbox): only `sudo [-n] COMMAND...` is answered")
    os.execvpe(args[0], args, {**env, ROOT_MARK: "1"})


def main(argv: list[str]) -> int:
    tool, args, env = os.path.basename(argv[0]), argv[1:], dict(os.environ)
    err, code = "", 0
    try:
        if tool == "sysctl":
            out, err, code = sysctl(args, env)
        elif tool == "sudo":
            sudo(args, env)
            return 127
        elif tool == "ifconfig":
            out = ifconfig(*node_link())
        elif tool in RDMA_TOOLS:
            try:
                out = getattr(macrdma, tool)(args, RECORDED, NODE)
            except ValueError as exc:
                raise ToolError(str(exc)) from None
        else:
            out = {"uname": lambda: uname(args), "sw_vers": lambda: sw_vers(args),
                   "pmset": lambda: pmset(args, env), "ioreg": lambda: ioreg(args),
                   "vm_stat": lambda: (RECORDED / "vm_stat.txt").read_text(),
                   "ps": lambda: ps(args), "stat": lambda: bsd_stat(args)}[tool]()
    except ToolError as exc:
        sys.stderr.write(f"{exc}\n")
        return exc.code
    sys.stdout.write(out)
    sys.stderr.write(err)
    return code


#: The tools this program answers as (``DIR/darwin/bin/<tool>``); ``tar`` links to bsdtar.
RDMA_TOOLS = ("rdma_ctl", "ibv_devinfo", "networksetup", "system_profiler")
TOOLS = ("uname", "sw_vers", "sysctl", "pmset", "vm_stat", "ioreg", "ifconfig", "ps", "stat",
         "sudo") + RDMA_TOOLS

if __name__ == "__main__":
    sys.exit(main(sys.argv))
