"""Where things live: the controller's state directory and the data shipped with mlxops."""

from __future__ import annotations

import os
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def controller_home() -> Path:
    """mlxops' state on the controller: facts cache, job records. ``$MLXOPS_HOME`` overrides."""
    return Path(os.environ.get("MLXOPS_HOME") or os.path.expanduser("~/.mlxops"))


def _data_dir(name: str) -> Path:
    # An installed wheel carries templates/ and playbooks/ inside the package (setup.py
    # copies them there); a checkout (or an editable install) has them at the top level.
    for candidate in (_PACKAGE / "_data" / name, _PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"mlxops is installed without its {name}/ directory")


def templates_dir() -> Path:
    return _data_dir("templates")


def playbooks_dir() -> Path:
    return _data_dir("playbooks")


def trainer_dir() -> Path:
    """The bundled trainer package, synced to every node."""
    return _PACKAGE / "trainer"


def node_dir() -> Path:
    """The node-side job helpers (``python -m mlxops.node``), synced with the trainer."""
    return _PACKAGE / "node"
