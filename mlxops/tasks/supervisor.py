"""Task ``supervisor`` (opt-in: ``--tags supervisor``): make the inventory's
``mlxops_supervisor`` host ready to supervise jobs (docs/supervisor.md).

On the supervisor host:

- ``<mlxops_root>/supervisor/venv``: a venv beside the node's ``mlxops_python`` (whose
  packages, mlx and numpy, it sees through a ``.pth`` line) with the controller's
  dependencies at the controller's own versions (fabric, paramiko, click, jinja2, PyYAML,
  rich, prometheus-client), from ``mlxops_wheelhouse`` when set, else the index. The
  mlxops package itself is not installed: launch ships the controller's own code with
  every job (:mod:`mlxops.jobs.supervising`), so the watchdog there is always the
  controller's version.
- ``~/.ssh/mlxops_supervisor``: an ed25519 key of its own (made once, never replaced).

On every selected host (the supervisor included: it reaches its own ranks over SSH too),
that key's public half in ``~/.ssh/authorized_keys``, appended once. The host keys the
supervisor trusts are not set here: launch writes those the controller verified.

Idempotent: what is there already is reported ok. ``--check`` changes nothing and says
what would change; ``--diff`` shows the line an ``authorized_keys`` gains.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from importlib import metadata
from typing import Any

from mlxops import shell
from mlxops import supervisorsite as rules
from mlxops.tasks.base import Outcome, TaskContext, task
from mlxops.tasks.python import PIP_TIMEOUT, push_wheelhouse

#: The controller's dependencies the watchdog imports, by their distribution names.
DISTRIBUTIONS = ("fabric", "paramiko", "click", "jinja2", "pyyaml", "rich",
                 "prometheus-client")
AUTHORIZED = "~/.ssh/authorized_keys"


def requirements() -> list[str]:
    """Each dependency pinned to the version the controller runs."""
    return [f"{name}=={metadata.version(name)}" for name in DISTRIBUTIONS]


def site_dir(root: str) -> str:
    return posixpath.join(root, rules.SITE_DIR)


def env_check_command(root: str) -> str:
    """Exit 0 when the supervisor's venv imports every module the watchdog needs."""
    python = rules.Site("", site_dir(root), "").python
    return shell.join([python, "-c", "import " + ",".join(rules.IMPORTS)])


def env_install_command(root: str, base_python: str, wheelhouse: str | None) -> str:
    python = rules.Site("", site_dir(root), "").python
    venv = posixpath.dirname(posixpath.dirname(python))
    pip = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    if wheelhouse:
        pip += ["--no-index", "--find-links", wheelhouse]
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    return shell.and_then([
        f"{{ test -x {shell.quote(python)} || "
        f"{shell.join([base_python, '-m', 'venv', venv])}; }}",
        # The node env's packages (mlx, numpy), seen after the venv's own: a .pth line
        # (--system-site-packages would show the base interpreter's, not a venv's).
        f"s=$({shell.join([python, '-c', purelib])})",
        f"{shell.join([base_python, '-c', purelib])} > \"$s\"/mlxops-node-env.pth",
        shell.join([*pip, *requirements()]),
        env_check_command(root),
    ])


def key_command(host: str, create: bool) -> str:
    """Print the supervisor key's public half; ``create`` makes the key first when absent.
    Prints nothing (exit 0) when it is absent and not to be made."""
    key = shell.path_word(rules.KEY_FILE)
    make = (f"{{ test -f {key} || {{ mkdir -p \"$HOME/.ssh\" && chmod 700 \"$HOME/.ssh\" && "
            f"ssh-keygen -q -t ed25519 -N '' -C {shell.quote(f'mlxops-supervisor@{host}')} "
            f"-f {key}; }}; }} && ") if create else ""
    return make + f"if [ -f {key}.pub ]; then cat {key}.pub; fi"


def public_key(line: str) -> tuple[str, str] | None:
    """``(type, base64)`` of an OpenSSH public key line; None when it is not one."""
    words = line.split()
    return (words[0], words[1]) if len(words) >= 2 else None


def authorize_command(key_line: str, check: bool) -> str:
    """Exit 0 and print ``present`` when ``authorized_keys`` has the key (type and base64
    compared, not the comment), else append it (not under check) and print ``added``."""
    kind, body = public_key(key_line) or ("", "")
    path = shell.path_word(AUTHORIZED)
    found = (f"if [ -f {path} ] && grep -qF {shell.quote(f'{kind} {body}')} {path}; "
             "then echo present; ")
    if check:
        return found + "else echo absent; fi"
    return (found + "else umask 077; mkdir -p \"$HOME/.ssh\" && "
            f"printf '%s\\n' {shell.quote(key_line)} >> {path} && chmod 600 {path} && "
            "echo added; fi")


@task("supervisor", scope="cluster")
def supervisor_task(contexts: Mapping[str, TaskContext], args: Mapping[str, Any]
                    ) -> dict[str, Outcome]:
    named = {ctx.host.var(rules.VARIABLE) for ctx in contexts.values()} - {None}
    if not named or named == {rules.CONTROLLER}:
        return {n: Outcome.skipped("no mlxops_supervisor in the inventory") for n in contexts}
    if len(named) > 1:
        return {n: Outcome.failed(f"mlxops_supervisor differs between hosts "
                                  f"({', '.join(sorted(named))}): set it under all: vars")
                for n in contexts}
    name = named.pop()
    if name not in contexts:
        return {n: Outcome.skipped(f"the supervisor {name} is not selected") for n in contexts}
    out: dict[str, Outcome] = {}
    home = contexts[name]
    if home.facts is None:
        return {n: Outcome.failed("no facts: run the 'facts' task first") for n in contexts}
    env = _environment(home)
    key = home.conn.run(key_command(name, create=not home.check), timeout=60)
    if not key.ok or (not home.check and not public_key(key.stdout)):
        return {**{n: Outcome.failed(f"the supervisor {name} has no key") for n in contexts},
                name: Outcome.failed(f"making {rules.KEY_FILE}: {key.error_line()}")}
    line = key.stdout.strip()
    for host, ctx in contexts.items():
        if not line:  # --check, no key yet: every host would get the one made
            out[host] = Outcome.changed(f"would authorise {name}'s new key")
            continue
        done = ctx.conn.run(authorize_command(line, ctx.check), timeout=60)
        said = done.stdout.strip()
        if not done.ok:
            out[host] = Outcome.failed(f"authorising {name}'s key: {done.error_line()}")
        elif said == "present":
            out[host] = Outcome.ok(f"{name}'s key authorised")
        else:
            diff = f"--- {AUTHORIZED}\n+++ {AUTHORIZED}\n+{line}\n" if ctx.diff else ""
            verb = "would authorise" if ctx.check else "authorised"
            out[host] = Outcome.changed(f"{verb} {name}'s key", diff=diff)
    own = out[name]
    if env.status == "failed":
        out[name] = env
    elif env.status == "changed" or own.status == "changed":
        out[name] = Outcome.changed("; ".join(m for m in (env.message, own.message) if m),
                                    diff=own.diff)
    return out


def _environment(ctx: TaskContext) -> Outcome:
    """The supervisor's venv: ok when it imports what the watchdog needs, else made."""
    root = ctx.facts.root
    where = site_dir(root)
    if ctx.conn.run(env_check_command(root), timeout=60).ok:
        return Outcome.ok(f"supervisor venv in {where}")
    if ctx.check:
        return Outcome.changed(f"would make the supervisor venv in {where}")
    wheelhouse, problem = push_wheelhouse(ctx)
    if problem:
        return Outcome.failed(problem)
    done = ctx.conn.run(env_install_command(root, ctx.host.python, wheelhouse),
                        timeout=PIP_TIMEOUT)
    if not done.ok:
        return Outcome.failed(f"making the supervisor venv in {where}: {done.error_line()}")
    return Outcome.changed(f"made the supervisor venv in {where}")
