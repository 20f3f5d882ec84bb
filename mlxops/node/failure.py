"""Why a rank failed, in one line, from its own log: the node's reader behind
``RankAnswer.failure`` (docs/node-protocol.md).

A rank that fails at start usually fails on every node the same way, and each one prints a
traceback; the controller shows each distinct reason once, with the ranks that share it
(:mod:`mlxops.jobs.status`). The reader takes this attempt's part of the log (after the
last :data:`protocol.START_LINE` its start script printed; a log without one is all this
attempt's) and finds, in this order:

1. the exception of the last Python traceback: the first unindented line after
   ``Traceback (most recent call last):`` and the lines of its message after it (but for
   lines another thread logged meanwhile, such as ``[ring] ...``);
2. a C++ exception nobody caught (``terminate called after throwing an instance of 'T'``
   then ``what():  message`` on Linux, ``libc++abi: terminating due to uncaught exception
   of type T: message`` on macOS): ``T: message``; of 1 and 2, the later in the log;
3. when the rank exited by itself with a code from 1 to 127 (not a signal), the last
   non-empty line, such as the trainer's ``error: ...``;

else nothing (a rank killed by a signal leaves no line that says why; its exit code does).
The reason is made one line: whitespace runs become one space, and beyond
:data:`MAX_CHARS` the middle is cut at word boundaries (`` ... ``), keeping the start
(the exception's type and what it did) and the end (what the system said).
"""

from __future__ import annotations

import re
from pathlib import Path

from mlxops.node import protocol

#: Bytes read from the end of a failed rank's log: tracebacks are at the end.
TAIL_BYTES = 64 << 10
#: The longest reason, in characters.
MAX_CHARS = 240
TRACEBACK = "Traceback (most recent call last):"
#: How a C++ exception nobody caught ends a process, before its abort (SIGABRT): the
#: prefix, up to the exception's type, then its message. libstdc++ (Linux) says
#: ``terminate called after throwing an instance of 'std::runtime_error'`` and, on the
#: next line, ``  what():  <message>``; libc++abi (macOS) says it in one line,
#: ``libc++abi: terminating due to uncaught exception of type std::runtime_error: <message>``
#: (``libc++abi.dylib: terminating with uncaught exception of type ...`` before macOS 11).
LIBSTDCXX = "terminate called after throwing an instance of "
LIBCXXABI = ("libc++abi: terminating due to uncaught exception of type ",
             "libc++abi.dylib: terminating with uncaught exception of type ")


#: A line a library's own logging printed (``[ring] Socket 3 was closed by the peer``):
#: another thread's output, which can land among the lines of the exception's message
#: (MLX's ring backend reports each failed send while the traceback is printed).
LOGGED = re.compile(r"\[[A-Za-z][\w:.-]*\] ")


def this_attempt(text: str) -> str:
    """The part of a log after the last line its start script printed at an attempt's
    start (all of it when there is none)."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(protocol.START_LINE)]
    return "\n".join(lines[starts[-1] + 1:] if starts else lines)


def one_line(parts: list[str]) -> str:
    """``parts`` as one line of at most :data:`MAX_CHARS`, its middle cut if need be."""
    line = " ".join(" ".join(parts).split())
    if len(line) <= MAX_CHARS:
        return line
    keep = (MAX_CHARS - len(" ... ")) // 2
    head, tail = line[:keep], line[-keep:]
    head = head.rsplit(" ", 1)[0] if " " in head else head
    tail = tail.split(" ", 1)[1] if " " in tail else tail
    return f"{head} ... {tail}"


def _python_exception(lines: list[str]) -> tuple[int, str] | None:
    """(where, why) of the last traceback's exception."""
    starts = [i for i, line in enumerate(lines) if line.strip() == TRACEBACK]
    if not starts:
        return None
    rest = lines[starts[-1] + 1:]
    # Frames are indented ("  File ...", their source, "^^^" markers); the exception is not.
    first = next((i for i, line in enumerate(rest) if line and not line[0].isspace()), None)
    if first is None:
        return None
    message = [rest[first], *(line for line in rest[first + 1:] if not LOGGED.match(line))]
    return starts[-1], one_line(message)


def _cpp_exception(lines: list[str]) -> tuple[int, str] | None:
    """(where, why) of the last uncaught C++ exception."""
    for i in range(len(lines) - 1, -1, -1):
        line = lines[i]
        for prefix in LIBCXXABI:
            if prefix in line:
                return i, one_line([line.split(prefix, 1)[1]])
        if line.startswith(LIBSTDCXX):
            kind = line[len(LIBSTDCXX):].strip().strip("'")
            what = next((after.split("what():", 1)[1] for after in lines[i + 1:i + 3]
                         if "what():" in after), "")
            return i, one_line([f"{kind}:", what] if what.strip() else [kind])
    return None


def failure_line(text: str, exit_code: int | None) -> str | None:
    """Why the rank whose log (this attempt's part) is ``text`` failed, or None."""
    lines = text.splitlines()
    found = [f for f in (_python_exception(lines), _cpp_exception(lines)) if f]
    if found:
        return max(found)[1]  # the one that ended the program came last
    if exit_code is not None and 0 < exit_code < 128:
        last = next((line for line in reversed(lines) if line.strip()), None)
        return None if last is None else one_line([last])
    return None


def read_failure(log: Path, exit_code: int | None) -> str | None:
    """:func:`failure_line` of the end of ``log`` (this attempt's part of it)."""
    try:
        with open(log, "rb") as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - TAIL_BYTES))
            data = f.read()
    except OSError:
        return None
    text = data.decode(errors="replace")
    if size > TAIL_BYTES:
        text = text.split("\n", 1)[-1]  # the first line read is likely cut
    return failure_line(this_attempt(text), exit_code)
