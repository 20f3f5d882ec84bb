"""On a Mac, the settings the provision ``macos`` task makes: the GPU's wired memory limit
and no system sleep (worked out by that task's own rules and arguments); and a release
build of macOS, not a beta."""

from __future__ import annotations

from mlxops.checks import when
from mlxops.readiness import beta_build
from mlxops.tasks.macos import wired_limit_mb

PRIVILEGED = "run mlxops provision with ansible_become: true"


def _mac(cluster, node) -> bool:
    # A host not read is what provision last saw; never seen, its checks apply (and
    # error, as the host does).
    return node.system in ("Darwin", None)


@when(_mac)
def check_wired_limit(node, cluster):
    """``iogpu.wired_limit_mb`` as provision sets it (``mlxops_wired_limit_mb``, else the
    playbook's share of RAM). A sysctl: a reboot resets it."""
    want = wired_limit_mb(node.facts, node.host.var("mlxops_wired_limit_mb"),
                          cluster.target.macos_args.get("wired_share"))
    have = node.facts.macos.wired_limit_mb if node.facts.macos else None
    if want is not None and have != want:
        raise node.fail(f"iogpu.wired_limit_mb {have}, want {want}",
                        f"{PRIVILEGED} (a reboot resets it)")


@when(_mac)
def check_sleep(node, cluster):
    """System sleep off (a sleeping Mac hangs every rank of a job)."""
    if not cluster.target.macos_args.get("disable_sleep", True):
        return
    sleep = node.facts.macos.sleep if node.facts.macos else None
    if sleep != 0:
        found = "sleep setting unknown" if sleep is None else f"sleeps after {sleep} min idle"
        raise node.fail(found, f"{PRIVILEGED}, or sudo pmset -a sleep 0")


@when(lambda cluster, node: node.system == "Darwin")
def check_macos_release(node, cluster):
    """Not a beta of macOS (betas have run MLX several times slower); a mix of builds
    across the hosts is check_versions_agree's finding."""
    build = node.facts.macos_build
    if beta_build(build):
        raise node.fail(f"macOS {node.facts.macos_version} build {build} is a beta",
                        "install the release build on every Mac of the job (betas have "
                        "run MLX several times slower)")
