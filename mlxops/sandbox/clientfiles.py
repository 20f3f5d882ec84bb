"""What the controller side uses to reach the nodes: known_hosts, ssh_config, inventory.

Rendered from the node list alone, so they are easy to read and easy to test.
"""

from __future__ import annotations

import os
from pathlib import Path


def known_hosts(host_keys: dict[str, str]) -> str:
    """``{ip: "ssh-ed25519 AAAA..."}`` -> known_hosts text (port 22: bare address)."""
    return "".join(f"{ip} {key}\n" for ip, key in host_keys.items())


def _cfg_word(value: object) -> str:
    text = str(value)
    return f'"{text}"' if any(c.isspace() for c in text) else text


def ssh_config(nodes: dict[str, str], user: str, key: Path, known: Path) -> str:
    """One Host block per node, so ``ssh -F DIR/ssh_config node1`` just works."""
    blocks = []
    for name, ip in nodes.items():
        blocks.append("\n".join([
            f"Host {name}",
            f"  HostName {ip}",
            f"  User {user}",
            "  Port 22",
            f"  IdentityFile {_cfg_word(key)}",
            "  IdentitiesOnly yes",
            f"  UserKnownHostsFile {_cfg_word(known)}",
            "  GlobalKnownHostsFile /dev/null",
            "  StrictHostKeyChecking yes",
            "  BatchMode yes",
            "  ConnectTimeout 5",
            "",
        ]))
    return "\n".join(blocks)


def inventory(nodes: dict[str, str], user: str, key: Path, known: Path, python: str) -> str:
    """An Ansible YAML inventory: group ``sandbox`` under ``all``, connection vars in
    ``all.vars`` (the ssh args also make real ``ansible`` honour the known_hosts)."""
    doc = {
        "all": {
            "vars": {
                "ansible_user": user,
                "ansible_ssh_private_key_file": str(key),
                "ansible_ssh_common_args": (
                    f"-o UserKnownHostsFile={known} -o StrictHostKeyChecking=yes"
                ),
                "mlxops_known_hosts": str(known),
                "mlxops_python": python,
            },
            "children": {
                "sandbox": {"hosts": {name: {"ansible_host": ip} for name, ip in nodes.items()}},
            },
        }
    }
    import yaml  # when a sandbox is made, not when the CLI starts

    header = "# Written by `mlxops sandbox up`; removed by `mlxops sandbox down`.\n"
    return header + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)


def write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    tmp.chmod(mode)
    os.replace(tmp, path)
