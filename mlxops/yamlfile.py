"""The one YAML reader of the controller: inventories, group_vars/host_vars, job files, playbooks.

It reads YAML the way Ansible's loader does (YAML 1.1 scalars, merge keys) with three rules
of mlxops' own, each refused in one line ``FILE: KEY: what is wrong (line N)``:

* a key written twice in one mapping: Ansible warns and keeps the last one; a silently
  dropped ``hosts:`` or ``global_batch:`` is a misconfigured cluster, so mlxops refuses it;
* merge keys (``<<: *defaults``, or ``<<: [*a, *b]``) load exactly as Ansible/PyYAML load
  them: keys written in the mapping override merged ones, and of several merged mappings
  the first one listed wins. Only keys written in the mapping itself count as duplicates;
* tags mlxops cannot honour: Ansible's ``!vault`` (encrypted values) and ``!unsafe``
  (untemplated strings), and any tag outside YAML's standard ones.

The checks run over the composed node tree before anything is constructed, so they see
each mapping as it was written (PyYAML rewrites a mapping in place when it resolves its
merge keys) and know the key path of every node for the message.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlxops.errors import bad_input

if TYPE_CHECKING:  # PyYAML is imported by the first file read: not by --help, not by status
    from yaml.nodes import Node

MERGE_TAG = "tag:yaml.org,2002:merge"

# Ansible's own tags, with what to do instead.
_ANSIBLE_TAGS = {
    "!vault": "an Ansible Vault value (!vault, line {line}) is not supported: mlxops cannot "
              "decrypt it; write the value in plain text or keep the secret out of this file",
    "!unsafe": "Ansible's !unsafe tag (line {line}) is not supported: mlxops never templates "
               "values, so drop the tag and write the plain string",
}


class _Refused(Exception):
    """A problem found in the node tree: key path, line (1-based), and what is wrong (which
    says the line too, for the message names the key)."""

    def __init__(self, key: str | None, line: int, problem: str) -> None:
        super().__init__(problem)
        self.key, self.line, self.problem = key, line, problem


def read_yaml(path: str | os.PathLike[str], what: str = "a YAML file") -> Any:
    """The data of one YAML file (None when empty); any problem is a one-line UserError.

    ``what`` names the kind of file in messages about reading it ("an inventory file").
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise bad_input(path, None, "no such file") from None
    except IsADirectoryError:
        raise bad_input(path, None, f"is a directory, not {what}") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or exc
        raise bad_input(path, None, f"cannot read: {reason}") from None
    return parse_yaml(text, path)


def parse_yaml(text: str, source: object) -> Any:
    """``read_yaml`` for text already read; ``source`` names it in messages."""
    import yaml

    # libyaml's parser when PyYAML has it, as Ansible does: the pure-Python one accepts a
    # few things libyaml refuses (``{a:}``), and a file should mean the same to both.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_tree(loader, node)
        return loader.construct_document(node)
    except _Refused as exc:
        raise bad_input(source, exc.key or f"line {exc.line}", exc.problem) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}" if mark else None
        problem = " ".join(str(exc.problem or exc).split())
        context = exc.context_mark
        if exc.context and context and mark and context.line != mark.line:
            # An unclosed bracket is reported where the file ends: say where it opened.
            problem += f" ({exc.context} at line {context.line + 1})"
        raise bad_input(source, where, f"invalid YAML: {problem}") from None
    except yaml.YAMLError as exc:
        raise bad_input(source, None, f"invalid YAML: {' '.join(str(exc).split())}") from None
    finally:
        loader.dispose()


def join_key(path: str | None, part: Any) -> str:
    """``all.hosts`` + ``mac1`` -> ``all.hosts.mac1``."""
    return f"{path}.{part}" if path else str(part)


def _check_tree(loader: Any, root: Node) -> None:
    """Refuse duplicate keys and unsupported tags, naming the key path of each."""
    from yaml.nodes import MappingNode, SequenceNode

    # Depth first in document order: an anchor comes before its aliases, so a node shared
    # through an alias is checked, and named, where it is written. An alias is the same node
    # object as its anchor: it is checked once.
    seen: set[int] = set()
    todo: list[tuple[Node, str | None]] = [(root, None)]
    while todo:
        node, key = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        _check_tag(loader, node, key)
        children: list[tuple[Node, str | None]] = []
        if isinstance(node, SequenceNode):
            children = [(item, f"{key or ''}[{i}]") for i, item in enumerate(node.value)]
        elif isinstance(node, MappingNode):
            first: dict[Any, Node] = {}
            for key_node, value_node in node.value:
                if key_node.tag == MERGE_TAG:
                    children.append((value_node, key))  # `<<: {inline: mapping}`
                    continue
                _check_tag(loader, key_node, key)
                name = loader.construct_object(key_node, deep=True)
                where = join_key(key, name)
                if _hashable(name):
                    if name in first:
                        line = key_node.start_mark.line + 1
                        raise _Refused(where, line, f"duplicate key at line {line} (first at "
                                                    f"line {first[name].start_mark.line + 1})")
                    first[name] = key_node
                children.append((value_node, where))
        todo.extend(reversed(children))


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _check_tag(loader: Any, node: Node, key: str | None) -> None:
    from yaml.nodes import ScalarNode

    tag, line = node.tag, node.start_mark.line + 1
    if tag in _ANSIBLE_TAGS:
        raise _Refused(key, line, _ANSIBLE_TAGS[tag].format(line=line))
    if tag not in loader.yaml_constructors:
        kind = "value" if isinstance(node, ScalarNode) else "collection"
        raise _Refused(key, line, f"YAML tag {tag!r} at line {line} on a {kind} is not "
                                  "supported")
