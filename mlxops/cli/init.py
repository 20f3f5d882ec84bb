"""``mlxops init [HOST...]``: find or take Macs, trust their keys on consent, read them,
and write the inventory and a starter job (docs/cli.md, "mlxops init").

The steps, each one a module of mlxops/init/: the candidates (named, or found over mDNS
and picked), a draft inventory (the existing file plus the candidates) loaded by the same
loader as every command, so bad input is refused before any host is touched; the keys
(``mlxops trust``'s own check and blocks); one probe command per host; the link rule; the
merged inventory and the job, written atomically only when nothing failed on the way.
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import click

from mlxops import console
from mlxops.cli.options import connect_options
from mlxops.errors import EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE, UserError


def _candidates(named, browse, pick_all, pipeline=None):
    """The hosts named (parsed), or those ``browse`` (a listening started already) finds
    over mDNS and picked; ``pipeline``: told of each one found as soon as it is heard
    (every one is taken: ``--all``)."""
    from mlxops.init.hosts import Candidate

    if named:
        return named
    if pipeline is not None:
        browse.hand_to(lambda f: pipeline.heard(Candidate(f.address, None, f.name)))
        pipeline.prepare()  # the draft's file and vars: hosts heard wait for it
    _warm_up()  # while mDNS answers come in: the imports the next steps need
    found = browse.wait()
    browse.close()
    if not found:
        raise UserError(f"init: no Mac answered _ssh._tcp over mDNS within {browse.seconds:g} s "
                        "(is Remote Login on?); name the hosts: mlxops init HOST...")
    for i, f in enumerate(found, 1):
        console.out.print(f"  {i}. {f.name}  {f.address}:{f.port}  {f.server}", markup=False)
    if not pick_all:
        answer = click.prompt("Which ones? (numbers, e.g. 1,3; 'all')", default="all")
        picked = _pick(answer, len(found))
        found = [found[i - 1] for i in picked]
    return [Candidate(f.address, None, f.name) for f in found]


def _warm_up() -> None:
    """Import what checking keys, probing and writing use (Fabric, paramiko, ruamel,
    the trainer's plan, rich's console): found over mDNS, the listening for the answers
    is spent on it (the list found is printed as soon as it ends); named, it is done
    before the first host is touched, not by the hosts' threads at once.

    Then the objects made so far (modules, classes, functions: ~600 modules' worth) are
    moved out of the cyclic garbage collector's sight (``gc.freeze``): they live until the
    process ends, yet each full collection walks them all again -- one such collection
    fell among the hosts' work (14-72 ms, load 1-6), and the interpreter's exit runs more
    (55 ms of CPU for init's modules, 10 ms after the freeze): benchmarks/README.md,
    "init.py". What is made from here on is collected as ever."""
    import importlib

    # In the order they are needed: Fabric and paramiko first, with which the first host
    # heard opens its connection (the transport's own module imports them only then, for
    # the commands that never connect); the key blocks shown; the writer, the probe and
    # the starter's plan.
    for module in ("mlxops.transport.jumps", "mlxops.cli.trust", "mlxops.init.flow"):
        importlib.import_module(module)
    from mlxops.init.writer import load

    load(None)  # ruamel.yaml itself
    console.out  # noqa: B018 - rich's console, made on first use: the list printed next
    gc.freeze()
    gc.enable()


def _pick(answer: str, count: int) -> list[int]:
    if answer.strip().lower() == "all":
        return list(range(1, count + 1))
    try:
        picked = sorted({int(w) for w in answer.replace(",", " ").split()})
    except ValueError:
        picked = []
    if not picked or any(not 1 <= i <= count for i in picked):
        raise UserError(f"init: {answer!r}: pick numbers from 1 to {count}, or 'all'")
    return picked


@click.command("init")
@click.argument("hosts", nargs=-1)
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              default=Path("inventory.yml"), show_default=True,
              help="The inventory to write; an existing one gets the new hosts only.")
@click.option("--job", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The starter job to write (default: first.yml beside the inventory; an "
                   "existing one is kept).")
@click.option("--all", "pick_all", is_flag=True, help="Take every Mac found (no prompt).")
@click.option("--diff", "show_diff", is_flag=True,
              help="Show what would change in the inventory and write nothing (no key "
                   "recorded either).")
@click.option("--user", help="SSH user of every node (all.vars.ansible_user).")
@click.option("--key", "key_file", help="SSH private key (all.vars."
                                         "ansible_ssh_private_key_file).")
@click.option("--known-hosts", help="A known_hosts file for this cluster (all.vars."
                                     "mlxops_known_hosts; default ~/.ssh/known_hosts).")
@click.option("--python", "pythons", multiple=True, metavar="PATH",
              help="An interpreter to try first for mlx (repeat); then python3 and Homebrew's.")
@click.option("--browse-seconds", type=click.FloatRange(0.5, 60), default=3.0,
              show_default=True, help="How long to listen for _ssh._tcp answers at most.")
@click.option("--browse-quiet", type=click.FloatRange(0.1, 60), default=0.5,
              show_default=True, help="Stop listening this long after the last new answer.")
@click.option("--interface", "interfaces", multiple=True, metavar="ADDR",
              help="Browse mDNS on this local address only (repeat; default: every one).")
@connect_options
def command(hosts, output, job, pick_all, show_diff, user, key_file,
            known_hosts, pythons, browse_seconds, browse_quiet, interfaces, connect):
    """Find Macs (mDNS) or take HOSTs, trust their keys, read them, and write an inventory
    and a starter job.

    Without HOST, the Macs offering SSH on the local network (Remote Login advertises
    _ssh._tcp over Bonjour) are listed to pick from (--all: every one). Each host's key
    fingerprint is shown and recorded only on consent, as `mlxops trust` does. The
    inventory gets a group per chip family, each host's address, user, data address on
    its fastest link to its peers (Thunderbolt, then Ethernet, then Wi-Fi), interpreter
    with MLX and slots; a re-run adds new hosts and keeps everything written, comments
    included. Unreachable hosts are left out (exit 3).
    """
    # Without HOST, the listening starts first, before init's own imports and reading
    # the files: python-zeroconf is all it imports, and the rest runs while the answers
    # are on their way (20-120 ms at each responder: mlxops/init/discover.py). A listening
    # connects to no host: the input is still checked before any host is touched.
    from mlxops.init.discover import Browse

    browse = None
    # No collection while init imports what it needs: the warm-up (while the answers
    # come, or before the hosts named are touched) freezes what the imports made and
    # collects again (its docstring says why).
    gc.disable()
    try:
        if not hosts:
            browse = Browse(browse_seconds, interfaces or None, browse_quiet)
        _init(hosts, output, job, pick_all, show_diff, user, key_file, known_hosts, pythons,
              browse, connect)
    finally:
        if browse is not None:
            browse.close()
        gc.enable()  # where an error ended the run before the warm-up did


def _init(hosts, output, job, pick_all, show_diff, user, key_file, known_hosts, pythons,
          browse, connect):
    from mlxops.init.flow import Init

    flow = Init(output=output, job=job or output.with_name("first.yml"), user=user,
                key_file=key_file, known_hosts=known_hosts, pythons=list(pythons),
                connect=connect)
    flow.read_existing()  # bad input first: before any host is touched
    from contextlib import nullcontext

    from mlxops.init.hosts import parse_spec
    from mlxops.init.pipeline import Pipeline
    from mlxops.transport import ConnectOptions, Connector

    named = [parse_spec(h) for h in hosts]
    # Without --accept-new-host-keys the keys are scanned and shown and recorded only on
    # consent; the connections accept no key that is not recorded (as trust's).
    # With that consent given up front (and nothing to leave unrecorded: not --diff), each
    # host's own connection records its new key as it opens, the one the probe then uses,
    # and when nothing is left to pick (the hosts named, or --all) each host's probe starts
    # as soon as its key is judged (mlxops/init/pipeline.py): found over mDNS, from the
    # moment its answer is heard, while the listening goes on.
    opened = bool(connect.accept_new_host_keys) and not show_diff
    if named:
        _warm_up()  # before the hosts' threads import it, each its own way; then frozen
    with Connector(ConnectOptions(accept_new_host_keys=opened,
                                  connect_timeout=connect.connect_timeout)) as connector, \
            (Pipeline(flow.drafts, connector, pythons,
                      peers=[c.address for c in named]) if opened and (named or pick_all)
             else nullcontext()) as pipeline:
        candidates = _candidates(named, browse, pick_all, pipeline)
        results, checks, new = flow.check_keys(candidates, connector, opened, pipeline)
        from mlxops.cli.trust import key_blocks  # (imported by _warm_up already)

        for line in key_blocks(results, checks):  # as `mlxops trust` shows them
            console.out.print(line, soft_wrap=True)
        record = bool(new) and not show_diff and (
            connect.accept_new_host_keys or click.confirm(f"Record {len(new)} new host key(s)?",
                                                  default=False))
        outcome = flow.finish(connector, record, show_diff)
    if outcome.unreachable:
        console.err.print(f"left out, unreachable: {', '.join(outcome.unreachable)}",
                          markup=False)
    if outcome.refused:
        console.err.print(f"left out, key not recorded: {', '.join(outcome.refused)}",
                          markup=False)
    if show_diff:
        console.out.print(outcome.diff or f"{output}: no change\n", markup=False,
                          soft_wrap=True, end="")
    else:
        for line in outcome.said:
            console.out.print(line, markup=False)
        if outcome.added or outcome.job_written:
            console.out.print(f"Next: mlxops provision {output} | mlxops bench {output} | "
                              f"mlxops check {output} | mlxops launch {outcome.job}",
                              markup=False)
    if outcome.unreachable:
        sys.exit(EXIT_UNREACHABLE)
    sys.exit(EXIT_FAILED if outcome.changed_keys else EXIT_OK)
