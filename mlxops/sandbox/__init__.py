"""Fake Mac nodes on Linux: network namespaces + one sshd each (DESIGN.md, "Testing
without Macs"). :class:`Sandbox` is the API; ``mlxops sandbox up|down`` the CLI."""

from mlxops.sandbox.cluster import (
    DEFAULT_DIR,
    Sandbox,
    SandboxInfo,
    default_dir,
    prerequisites,
    require_root,
)

__all__ = ["DEFAULT_DIR", "Sandbox", "SandboxInfo", "default_dir", "prerequisites",
           "require_root"]
