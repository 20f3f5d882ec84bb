"""The one place that builds shell command lines.

Every value that reaches a shell — on the controller or on a node — goes through
:func:`quote`, so that nothing a user typed (an inventory variable, a job name, an
environment value) is ever interpreted by a shell. Remote commands are always built
as lists of words and joined here.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping, Sequence

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def quote(value: object) -> str:
    """Quote one word for a POSIX shell (``sh``, ``bash``, ``zsh``)."""
    return shlex.quote(str(value))


def join(argv: Sequence[object]) -> str:
    """Join a list of words into one command line, each word quoted."""
    if isinstance(argv, (str, bytes)):
        raise TypeError("join() takes a list of words, not a string")
    return " ".join(quote(a) for a in argv)


def is_env_name(name: str) -> bool:
    return bool(_ENV_NAME.match(name))


class Prepend(str):
    """An environment value that goes *before* the one the variable has when the line runs,
    ``:``-separated, instead of replacing it (``LD_PRELOAD``: what the node's session
    already preloads stays preloaded). Written ``NAME='value'${NAME:+:$NAME}``."""


def assignment(name: str, value: object) -> str:
    """``NAME='value'`` (a :class:`Prepend` keeps the variable's current value after it)."""
    if not is_env_name(name):
        raise ValueError(f"not an environment variable name: {name!r}")
    rest = f'${{{name}:+":${name}"}}' if isinstance(value, Prepend) else ""
    return f"{name}={quote(value)}{rest}"


def env_assignments(env: Mapping[str, object]) -> str:
    """``A='1' B='x y'``: a prefix of assignments for a command (names are checked)."""
    return " ".join(assignment(name, value) for name, value in env.items())


def export_lines(env: Mapping[str, object]) -> str:
    """The body of an env file: one ``export NAME='value'`` line per variable."""
    return "".join(f"export {assignment(name, value)}\n" for name, value in env.items())


def with_env(argv: Sequence[object], env: Mapping[str, object]) -> str:
    """``env A='1' cmd 'arg'``: run argv with extra environment."""
    if not env:
        return join(argv)
    return f"env {env_assignments(env)} {join(argv)}"


def privileged(argv: Sequence[object]) -> list[object]:
    """argv run as root with ``sudo -n``: no prompt, so a host without passwordless sudo
    fails at once instead of hanging a parallel run on a password nobody can type."""
    return ["sudo", "-n", *argv]


def path_word(path: str) -> str:
    """Quote a node path, keeping a leading ``~/`` expandable by the remote shell.

    ``~/.mlxops/code`` becomes ``"$HOME"/'.mlxops/code'``: the home is the node's,
    the rest is quoted like any other value.
    """
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        rest = path[2:]
        return '"$HOME"/' + quote(rest) if rest else '"$HOME"/'
    return quote(path)


#: The POSIX shell every remote command runs in, whatever the node user's login shell.
POSIX_SH = "/bin/sh"


def posix_sh(command: str) -> str:
    """``exec /bin/sh -c '<command>'``: the line sent over SSH for ``command``.

    sshd runs what a client sends as ``$SHELL -c <line>``, with the user's login shell:
    zsh on a stock Mac (since 10.15), where an unmatched glob is an error (NOMATCH),
    unquoted ``$VAR`` is not word-split and ``=word`` expands to a path. Every command
    mlxops builds is POSIX ``sh``; this wrapper makes the login shell parse one quoted
    word and hand the command to ``/bin/sh`` unchanged (bash 3.2 in POSIX mode or dash on
    macOS, dash or bash on Linux). ``exec`` keeps the pid: ``$$`` inside is still the
    session's process group leader. Login shells that parse single quotes as POSIX does
    (sh, bash, zsh, ksh, fish) work; csh/tcsh do not (a newline inside quotes is an error
    there).
    """
    return f"exec {POSIX_SH} -c {quote(command)}"


def and_then(commands: Iterable[str]) -> str:
    """Chain already-built command lines with ``&&``."""
    return " && ".join(c for c in commands if c)
