"""The later tasks' reads, taken along in the facts command (:mod:`mlxops.tasks.facts`).

A task that must read a node before it decides (a managed file, the synced code's
manifest: :attr:`TaskSpec.read <mlxops.tasks.base.TaskSpec>`) gets its answer from the
facts round trip instead of one of its own: a shell read runs in a subshell of its own
after the facts, a Python read in the interpreter that probes ``mlxops_python``; each
prints its output and then its exit code in sections of their own, under :data:`MARK`
like every section of that command. A read without its exit code is not answered (the
script was cut short): its task reads again.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from mlxops import shell
from mlxops.tasks.base import Prefetched, PythonRead

MARK = "@@mlxops:"   # starts each section's line in the facts command's output
READ, EXIT = "read:", "exit:"  # a read's sections: what it printed, then its exit code

# After the probe, in the same interpreter: each Python read (label, source, argv) prints
# its sections as reads_script's commands do.
_PYTHON_READS = r"""
def _mlxops_reads(reads):
    import sys
    for label, source, argv in reads:
        print("@@mlxops:read:" + label)
        sys.stdout.flush()
        sys.argv[:] = [label, *argv]
        try:
            exec(compile(source, label, "exec"), {"__name__": "__mlxops_read__"})
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            code = 1
        sys.stdout.flush()
        print("\n@@mlxops:exit:" + label)
        print(code)
        sys.stdout.flush()
"""


def python_reads_code(reads: Mapping[str, PythonRead]) -> str:
    """Python source that runs every read of ``reads`` (``{label: PythonRead}``) in turn."""
    if not reads:
        return ""
    table = [(label, r.source, list(r.argv)) for label, r in reads.items()]
    return f"{_PYTHON_READS}\n_mlxops_reads({json.dumps(table)})\n"


def reads_script(reads: Mapping[str, str]) -> str:
    """Each read (``{label: command}``) in a subshell of its own, its output and exit code
    in sections of their own; its stderr is dropped (a failed read is read again by its
    task, which then reports the error)."""
    parts = []
    for label, command in reads.items():
        parts.append(f"printf '%s\\n' {shell.quote(MARK + READ + label)}; "
                     f"( {command}\n) </dev/null 2>/dev/null; s=$?; "
                     # A newline first: the exit's mark starts a line even after output
                     # without a last newline (and the sections' split takes it back).
                     f"printf '\\n%s\\n' {shell.quote(MARK + EXIT + label)}; "
                     f"printf '%s\\n' \"$s\"\n")
    return "".join(parts)


def read_answers(sections: Mapping[str, str], labels: Iterable[str]) -> dict[str, Prefetched]:
    """What each read printed, by label; a read without its exit code is not there (the
    script was cut short)."""
    out = {}
    for label in labels:
        code = sections.get(EXIT + label, "").strip()
        if code.isdigit():
            out[label] = Prefetched(int(code), sections.get(READ + label, ""))
    return out
