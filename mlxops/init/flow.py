"""One ``mlxops init`` run: the draft, the keys, the probes, the files.

Policy. The draft inventory is the existing file plus one entry per new candidate
(``ansible_host``, ``ansible_user``) and the command line's ``all.vars``, loaded by the
loader every command uses (:mod:`.drafts`): a bad file or value is refused (exit 2) before
any host is touched. Every host of the draft (old ones too: they are the new ones' peers
and the job's nodes) has its key checked by ``mlxops trust``'s code; new keys are
recorded only on consent, never under ``--diff``; a host whose key is not recorded,
changed, or who does not answer is left out (:func:`~.pipeline.verdict`). The rest are
probed in parallel -- or, with consent given up front and nothing left to pick (the hosts
named, or every host found taken), each was probed as soon as its own key was judged
(:mod:`.pipeline`; found over mDNS, from its answer on) -- each tries its peers' addresses
in its subnets (a second command on the same connection), the link rule picks each data
address, and the new hosts are merged into the original document (comments kept). Files
are written only at the end, atomically.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mlxops.errors import UserError
from mlxops.init import writer
from mlxops.init.drafts import Drafts
from mlxops.init.hosts import Candidate, inventory_name, is_address
from mlxops.init.links import data_addresses, peer_targets
from mlxops.init.pipeline import CHANGED_KEY, REFUSED, TRUSTED, UNREACHABLE, Pipeline, verdict
from mlxops.init.probe import Probed, probe, reaches
from mlxops.init.slots import slots
from mlxops.init.starter import Node, render

GiB = 2**30


@dataclass
class Outcome:
    added: list[str] = field(default_factory=list)
    unreachable: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    changed_keys: list[str] = field(default_factory=list)
    diff: str = ""
    job: Path | None = None
    job_written: bool = False
    said: list[str] = field(default_factory=list)


def summary(facts, python: str | None, mlx: str | None) -> str:
    """The comment above a host: what was found."""
    parts = [facts.chip or f"{facts.system or '?'} {facts.arch or ''}".strip()]
    if facts.memory_bytes:
        parts.append(f"{facts.memory_bytes / GiB:.0f} GiB")
    if facts.macos_version:
        parts.append(f"macOS {facts.macos_version} ({facts.macos_build})")
    parts.append(f"mlx {mlx}" if python else "no python with mlx found")
    return ", ".join(parts)


class Init:
    def __init__(self, output: Path, job: Path, user: str | None, key_file: str | None,
                 known_hosts: str | None, pythons: Sequence[str], connect) -> None:
        self.output, self.job, self.pythons, self.connect = output, job, list(pythons), connect
        self.common = {"ansible_user": user, "ansible_ssh_private_key_file": key_file,
                       "mlxops_known_hosts": known_hosts}
        self.old_text = ""
        self.probed = None  # the pipeline's probes, when it ran them

    def read_existing(self) -> None:
        """The existing inventory, if any: it must load (exit 2 naming it otherwise)."""
        for path, option in ((self.output, "-o"), (self.job, "--job")):
            if not path.parent.is_dir():
                raise UserError(f"init: {option} {path}: no directory {path.parent}")
        if not self.output.exists():
            return
        self.old_text = self.output.read_text()
        from mlxops.inventory import load_inventory

        load_inventory(self.output)
        try:
            writer.load(self.old_text)
        except Exception as exc:  # ruamel's own errors: one line naming the file
            raise UserError(f"{self.output}: {exc}") from None

    def drafts(self) -> Drafts:
        """The draft inventory's maker: the file and the command line's vars."""
        return Drafts(self.output, self.old_text, self.common)

    def check_keys(self, candidates: Sequence[Candidate], connector, opened: bool = False,
                   pipeline: Pipeline | None = None):
        """The draft's hosts' keys, by ``mlxops trust``'s check: ``(results, checks,
        new)``, ``new`` the keys not known yet (the caller shows them and asks).
        ``opened``: consent was given before (``--accept-new-host-keys``, not ``--diff``)
        and ``connector`` records new keys itself: each host's own connection is opened
        and judged (:func:`mlxops.trust.open_and_judge`), its new key recorded then, and
        the probe goes on over it -- one SSH handshake a host, as ``trust``'s scan.
        ``pipeline``: nothing is left to pick either (the hosts named, or ``--all``), and
        each one's work, probe included, was started at once or as its answer came
        (:mod:`mlxops.init.pipeline`): it is started here if it was not, and its end
        waited for."""
        from mlxops.trust import NEW, check_host_keys, every_check, open_and_judge

        if pipeline is not None:
            done = pipeline.wait(candidates)
            self.fresh, self.inventory, self.probed = done.fresh, done.inventory, done.probes
            self.results = done.keys
            self.checks = {h: r.value for h, r in done.keys.items() if r.value is not None}
        else:
            drafts = self.drafts()
            for c in candidates:
                drafts.add(c)
            self.fresh, self.inventory = drafts.fresh, drafts.load()
            check = open_and_judge if opened else check_host_keys
            self.results, self.checks = check(self.inventory.select(None), connector)
        return self.results, self.checks, [c for c in every_check(self.checks)
                                           if c.state == NEW]

    def finish(self, connector, record: bool, dry: bool) -> Outcome:
        """Record the new keys if ``record`` (never when ``dry``), probe every trusted
        host, and write (or, ``dry``, diff) the files."""
        from mlxops.transport import run_parallel
        from mlxops.trust import record_new_keys

        out = Outcome(job=self.job)
        record = record and not dry
        if record:  # the keys an opened connection recorded already are skipped
            record_new_keys(self.checks)
        label = {h.name: (self.fresh[h.name].address if h.name in self.fresh else h.name)
                 for h in self.inventory.select(None)}
        trusted = []
        left_out = {UNREACHABLE: out.unreachable, CHANGED_KEY: out.changed_keys,
                    REFUSED: out.refused}
        for host in self.inventory.select(None):
            said = verdict(self.checks.get(host.name), record)
            if said == TRUSTED:
                trusted.append(host)
            else:
                left_out[said].append(label[host.name])
        if self.probed is not None:  # probed by the pipeline, each as its key was judged
            probed_results = self.probed
        else:
            # Tried in the probe's own command: the other hosts' SSH addresses (most
            # peers' data addresses are those; a Thunderbolt one is tried after, where
            # there is one), as the connections resolved them (an ~/.ssh/config alias:
            # its HostName).
            ssh = {h.name: getattr(connector.connect(h), "address", h.address)
                   for h in trusted}
            peers = sorted({a for a in ssh.values() if is_address(a)})
            probed_results = run_parallel(
                trusted, lambda h: probe(connector.connect(h), h, self.pythons,
                                         [p for p in peers if p != ssh[h.name]]))
        probed: dict[str, Probed] = probed_results.succeeded_values()
        out.unreachable += [label[h] for h in probed_results if h not in probed]
        reached = self._reach(connector, [h for h in trusted if h.name in probed], probed, out)
        self._build(out, self.fresh, self.inventory, probed, dry, reached)
        return out

    def _reach(self, connector, hosts, probed: dict[str, Probed], out: Outcome
               ) -> set[tuple[str, str]]:
        """``(host, address)`` for every peer address a host connected to (by inventory
        names); a host that could not try (no python with mlx) is taken at its subnets'
        word, and said so."""
        from mlxops.transport import run_parallel

        targets = peer_targets({h.name: probed[h.name].links for h in hosts})
        reached = {(h.name, ip) for h in hosts for ip in probed[h.name].reached}
        rest = {h.name: [ip for ip in targets[h.name] if ip not in probed[h.name].tried]
                for h in hosts}
        results = run_parallel(
            [h for h in hosts if rest[h.name] and probed[h.name].python],
            lambda h: reaches(connector.connect(h), probed[h.name].python, rest[h.name]))
        tried = results.succeeded_values()
        reached |= {(name, ip) for name, ips in tried.items() for ip in ips}
        untried = [h.name for h in hosts if rest[h.name] and h.name not in tried]
        reached |= {(name, ip) for name in untried for ip in rest[name]}
        if untried:
            out.said.append(f"links not tried from {', '.join(untried)} (no python with "
                            "mlx): taken from their subnets")
        return reached

    def _build(self, out: Outcome, fresh: dict[str, Candidate], inventory,
               probed: dict[str, Probed], dry: bool, reached: set[tuple[str, str]]) -> None:
        old_names = [h.name for h in inventory.select(None) if h.name not in fresh]
        names: dict[str, str] = {n: n for n in old_names}
        for draft in fresh:
            if draft in probed:
                names[draft] = inventory_name(probed[draft].facts.hostname,
                                              fresh[draft].label, names.values())
        order = [n for n in (h.name for h in inventory.select(None)) if n in probed]
        chosen = data_addresses({names[n]: probed[n].links for n in order},
                                [names[n] for n in order],
                                {(names[n], ip) for n, ip in reached if n in names})
        hosts = {h.name: h for h in inventory.select(None)}
        # A new host's ranks by the facts' rule; one already in the file keeps its own.
        ranks = {n: slots(probed[n].facts) if n in fresh else hosts[n].slots for n in order}
        new_hosts = []
        for draft, c in fresh.items():
            if draft not in probed:
                continue
            p = probed[draft]
            f = p.facts
            from mlxops.init.writer import chip_family

            new_hosts.append(writer.NewHost(
                names[draft], c.address, c.user, chip_family(f.chip, f.system, f.arch),
                chosen[names[draft]], p.python, ranks[draft], summary(f, p.python, p.mlx),
                p.sudo and f.is_darwin))
        doc = writer.load(self.old_text)
        out.added = writer.merge(doc, new_hosts, self.common)
        # No host taken and no file yet: nothing to write (not a file of all.vars alone).
        new_text = writer.dump(doc) if out.added or self.old_text else self.old_text
        job_text = None
        nodes = [Node(names[n], int(probed[n].facts.memory_bytes or 0),
                      probed[n].facts.ranks_working_set, ranks[n])
                 for n in order if probed[n].facts.memory_bytes]
        if nodes and not self.job.exists():
            job_text = render(self.job.stem, self.job, self.output, nodes)
        out.diff = writer.diff(self.old_text, new_text, self.output) if new_text != \
            self.old_text else ""
        if dry:
            if job_text:
                out.diff += writer.diff("", job_text, self.job)
            return
        if new_text != self.old_text:
            writer.write_atomic(self.output, new_text)
            out.said.append(f"{self.output}: {len(out.added)} host(s) added"
                            + (f" ({', '.join(out.added)})" if out.added else ""))
        else:
            out.said.append(f"{self.output}: nothing new")
        if job_text:
            writer.write_atomic(self.job, job_text)
            out.job_written = True
            out.said.append(f"{self.job}: starter job for {len(nodes)} node(s)")
        elif self.job.exists():
            out.said.append(f"{self.job}: kept as it is")
