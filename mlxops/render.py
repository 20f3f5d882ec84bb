"""Rendering the files mlxops writes for a cluster: hostfiles and the env file (Jinja2).

Templates live in ``templates/`` (:func:`mlxops.paths.templates_dir`) and render with
``StrictUndefined``, so a missing value is an error, never an empty string. Values reach a
template through two filters only: ``tojson`` (JSON values; the JSON output is parsed back
before it is returned, so a broken template fails here, not in ``mlx.launch``) and
``shquote`` (:func:`mlxops.shell.quote`, for the sourced env file).

What mlx.launch expects (``mlx/_distributed_utils``): a hostfile entry is ONE rank, so a
host with ``mlxops_slots: N`` appears N times; ``ssh`` is what the controller's ``ssh``
command reaches; ``ips`` are what the ring backend listens on (ports are consecutive from
``--starting-port``, one per rank); ``rdma`` is the jaccl device matrix row of that rank.

The ``ssh`` word (also the host word of the MPI hostfile, as mlx.launch's own mpi launcher
writes it): ``mlxops_ssh_target`` when set; ``127.0.0.1`` for ``ansible_connection:
local`` (mlx.launch runs that rank without ssh); the inventory name when ``ansible_port``
is not 22 (``user@host`` cannot carry a port: the name must then be a ``~/.ssh/config``
Host alias); else ``ansible_user@address``, or the bare address without a user. mlx.launch
runs the system ``ssh``, which does not read ``ansible_ssh_private_key_file``: keys come
from ``~/.ssh/config`` or an agent.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from mlxops import paths, shell
from mlxops.errors import bad_input
from mlxops.inventory.variables import ring_ordered
from mlxops.node.protocol import BACKENDS, DEFAULT_BACKEND, JACCL_BACKENDS, JACCL_RING, MPI

if TYPE_CHECKING:  # Jinja2 is imported by the first template rendered (environment())
    import jinja2

LAUNCH_TEMPLATE = "mlx-hostfile.json.j2"
MPI_TEMPLATE = "mpi-hostfile.txt.j2"
ENV_TEMPLATE = "env.sh.j2"
# mlx.launch --starting-port's default: the ring ports of a run from the rendered hostfile.
DEFAULT_BASE_PORT = 32323


def _tojson(value: Any) -> str:
    # Jinja's own tojson HTML-escapes <, >, & and ': right for HTML, wrong for a JSON file.
    return json.dumps(value, ensure_ascii=False)


def _envname(name: Any) -> str:
    if not (isinstance(name, str) and shell.is_env_name(name)):
        raise ValueError(f"not an environment variable name: {name!r}")
    return name


_ENV: jinja2.Environment | None = None


def environment() -> jinja2.Environment:
    """The Jinja environment of ``templates/`` (built once)."""
    global _ENV
    if _ENV is None:
        import jinja2

        env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(str(paths.templates_dir())),
            undefined=jinja2.StrictUndefined,
            autoescape=False,
            keep_trailing_newline=True,
        )
        env.filters["tojson"] = _tojson
        env.filters["shquote"] = shell.quote
        env.filters["envname"] = _envname
        _ENV = env
    return _ENV


def render_template(name: str, **values: Any) -> str:
    return environment().get_template(name).render(**values)


# --- who a host is to others ----------------------------------------------------------


def ssh_target(host: Any) -> str:
    """The word ``ssh`` (and so mlx.launch and mpirun) is given to reach ``host``."""
    explicit = host.var("mlxops_ssh_target")
    if explicit:
        return explicit
    if host.connection == "local":
        return "127.0.0.1"
    if host.port != 22:
        return host.name
    return f"{host.user}@{host.address}" if host.user else host.address


def cluster_ip(host: Any) -> str:
    """The address other ranks reach ``host`` on (local hosts: loopback unless mlxops_ip)."""
    if host.connection == "local" and not host.is_set("mlxops_ip"):
        return "127.0.0.1"
    return host.ip


def in_order(hosts: Sequence[Any], order: Sequence[str], source: object = "--order",
             known: Collection[str] | None = None) -> list[Any]:
    """``hosts`` in the ring order ``order`` gives (``mlxops bench``'s best ring), by the
    rule of ``mlxops_ring_order`` (:func:`~mlxops.inventory.variables.ring_ordered`): the
    hosts it lists first, in its order, then the others. ``known``: every host of the
    inventory (default: ``hosts``); the order may name known hosts not selected, not
    others."""
    by_name = {h.name: h for h in hosts}
    known = by_name if known is None else known
    for i, name in enumerate(order):
        if name not in known:
            raise bad_input(source, f"ring.order[{i}]",
                            f"no host named {name!r} among {', '.join(known)}")
    return [by_name[name] for name in ring_ordered(list(by_name), order)]


def rank_hosts(hosts: Iterable[Any]) -> list[Any]:
    """The one rank order: one entry per rank, hosts in the order given (the inventory's,
    so ``mlxops_ring_order``'s), a host with N slots N times in a row. Rank ``r`` runs on
    ``rank_hosts(hosts)[r]``; :func:`mlxops.jobs.placement.place_ranks` numbers them."""
    return [h for h in hosts for _ in range(h.slots)]


# --- the mlx.launch hostfile --------------------------------------------------------------


def rdma_matrix(hosts: Sequence[Any], backend: str, source: object = "inventory"
                ) -> list[list[Any]]:
    """Row per rank: None on the diagonal, else ``mlxops_rdma[<peer host>]`` of the row's host.

    jaccl needs a device for every pair, jaccl-ring only for ring neighbours (as mlx.launch
    checks); RDMA over Thunderbolt is one rank per Mac, so jaccl refuses mlxops_slots > 1.
    """
    for h in hosts:
        if h.slots != 1:
            raise bad_input(source, f"{h.name}.mlxops_slots",
                            f"backend {backend} runs one rank per host, got {h.slots}")
    n = len(hosts)
    rows = []
    for i, h in enumerate(hosts):
        devices = h.var("mlxops_rdma") or {}
        rows.append([None if i == j else devices.get(peer.name) for j, peer in enumerate(hosts)])
    needed = (((i - 1) % n, (i + 1) % n) if backend == JACCL_RING else range(n)
              for i in range(n))
    for i, peers in enumerate(needed):
        for j in peers:
            if i != j and rows[i][j] is None:
                raise bad_input(source, f"{hosts[i].name}.mlxops_rdma.{hosts[j].name}",
                                f"backend {backend} needs the RDMA device that reaches "
                                f"{hosts[j].name}, e.g. rdma_en3")
    return rows


def launch_envs(hosts: Sequence[Any], backend: str, source: object = "inventory") -> list[str]:
    """``envs`` of the hostfile: what mlx.launch exports to every rank.

    mlx.launch applies ``envs`` to all ranks alike, so only settings every host shares go
    here; per-host differences live in each node's ``env.sh``. MLX_METAL_FAST_SYNCH is
    written only when the inventory sets it (and then must agree on every host).
    """
    envs: dict[str, str] = {}
    if hosts:
        first = hosts[0].env
        for name, value in first.items():
            if all(h.env.get(name) == value for h in hosts):
                envs[name] = value
    if any(h.is_set("mlxops_metal_fast_synch") for h in hosts):
        values = {_fast_synch(h) for h in hosts}
        if len(values) > 1:
            raise bad_input(source, "mlxops_metal_fast_synch",
                            "must be the same on every host of one job, got "
                            + " and ".join(sorted(values)))
        envs.setdefault("MLX_METAL_FAST_SYNCH", values.pop())
    if backend == MPI and hosts:
        links = {str(h.var("mlxops_btl_tcp_links")) for h in hosts}
        if len(links) == 1:
            envs.setdefault("OMPI_MCA_btl_tcp_links", links.pop())
        ifs = {h.var("mlxops_btl_tcp_if_include") for h in hosts}
        if len(ifs) == 1 and None not in ifs:
            envs.setdefault("OMPI_MCA_btl_tcp_if_include", ifs.pop())
    return [f"{_envname(k)}={v}" for k, v in envs.items()]


def launch_hostfile(hosts: Sequence[Any], backend: str = DEFAULT_BACKEND,
                    source: object = "inventory") -> str:
    """The mlx.launch ``--hostfile`` JSON text for ``hosts`` and ``backend``."""
    if backend not in BACKENDS:
        raise bad_input(source, "backend", f"must be one of {', '.join(BACKENDS)}, got "
                                           f"{backend!r}")
    if not hosts:
        raise bad_input(source, "hosts", "no hosts selected")
    ranks = rank_hosts(hosts)
    matrix = rdma_matrix(hosts, backend, source) if backend in JACCL_BACKENDS else None
    entries = [{"ssh": ssh_target(h), "ips": [cluster_ip(h)],
                "rdma": matrix[i] if matrix is not None else []}
               for i, h in enumerate(ranks)]
    text = render_template(LAUNCH_TEMPLATE, backend=backend,
                           envs=launch_envs(hosts, backend, source), ranks=entries)
    data = json.loads(text)  # a template bug must fail here, not on the cluster
    _check_launch_shape(data, len(ranks))
    return text


def _check_launch_shape(data: Any, ranks: int) -> None:
    ok = (isinstance(data, dict) and isinstance(data.get("backend"), str)
          and isinstance(data.get("envs"), list) and isinstance(data.get("hosts"), list)
          and len(data["hosts"]) == ranks
          and all(isinstance(h, dict) and set(h) == {"ssh", "ips", "rdma"}
                  for h in data["hosts"]))
    if not ok:
        raise ValueError(f"{LAUNCH_TEMPLATE} rendered a hostfile of the wrong shape")


# --- MPI hostfile ------------------------------------------------------------------------


def mpi_hostfile(hosts: Sequence[Any]) -> str:
    """Open MPI hostfile: ``<ssh target> slots=N`` per host (as mlx.launch writes it)."""
    for h in hosts:
        target = ssh_target(h)
        if not target or any(c.isspace() for c in target) or target.startswith("#"):
            raise ValueError(f"{h.name}: cannot write {target!r} into an MPI hostfile")
    rows = [{"target": ssh_target(h), "slots": int(h.slots)} for h in hosts]
    return render_template(MPI_TEMPLATE, hosts=rows)


# --- env.sh ------------------------------------------------------------------------------


def _fast_synch(host: Any) -> str:
    return str(host.var("mlxops_metal_fast_synch"))


def interface_for(address: str, interfaces: Mapping[str, Sequence[str]]) -> str | None:
    """The interface (from facts) that carries ``address``, or None."""
    try:
        wanted = ipaddress.ip_address(address)
    except ValueError:
        return None
    for name, addrs in interfaces.items():
        for a in addrs:
            try:
                if ipaddress.ip_address(str(a).split("/")[0].split("%")[0]) == wanted:
                    return name
            except ValueError:
                continue
    return None


def host_environment(host: Any, interface: str | None) -> dict[str, str]:
    """Everything ``env.sh`` exports for ``host``; ``interface`` is btl_tcp_if_include."""
    env = {"OMPI_MCA_btl_tcp_links": str(host.var("mlxops_btl_tcp_links"))}
    if interface:
        env["OMPI_MCA_btl_tcp_if_include"] = interface
    env["MLX_METAL_FAST_SYNCH"] = _fast_synch(host)
    env.update(host.env)  # the user's own mlxops_env has the last word
    return env


def env_file(env: Mapping[str, object]) -> str:
    """The text of ``env.sh``: a managed header, then ``export NAME='value'`` lines."""
    for name in env:
        _envname(name)
    return render_template(ENV_TEMPLATE, env={k: str(v) for k, v in env.items()})
