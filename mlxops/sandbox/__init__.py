"""Fake Mac nodes on Linux: network namespaces + one sshd each (README.md, "Testing
without Macs"). :class:`Sandbox` is the API; ``mlxops sandbox up|down|status|sleep|wake``
the CLI (``sleep``: every process of a node frozen, as a Mac asleep)."""

from mlxops.sandbox.cluster import Sandbox, prerequisites, require_root
from mlxops.sandbox.state import DEFAULT_DIR, SandboxInfo, default_dir

__all__ = ["DEFAULT_DIR", "Sandbox", "SandboxInfo", "default_dir", "prerequisites",
           "require_root"]
