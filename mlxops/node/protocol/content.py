"""Content's half of the controller-node protocol: a directory of large files on a node.

Standard library only, synced with the rest of ``mlxops/node``. Prepared token shards and a
fine-tuning base model are placed on nodes by :mod:`mlxops.jobs.content` (the controller);
before and after sending, it asks the node what it holds with the one command here:

* ``content`` lists every regular file under a directory (relative path and size) and the
  sha256 of the files named with ``--hash``, read from the node's hash cache when a file's
  size, mtime and inode are those it was hashed at (a launch then hashes nothing it hashed
  before: shards are GBs), else hashed and cached. It changes no file but the cache.

For people: docs/node-protocol.md, "Content".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from mlxops.node.protocol.decode import Record

CONTENT = "content"
COMMANDS = (CONTENT,)


def content_args(directory: str, cache: str, hash_names: Sequence[str]) -> list[str]:
    """List ``directory``; hash ``hash_names`` (relative to it) through the cache file
    ``cache`` (both absolute, or relative to where the command runs)."""
    return [CONTENT, "--dir", directory, "--cache", cache, "--hash", *hash_names]


def add_parsers(sub: Any) -> None:
    content = sub.add_parser(CONTENT)
    content.add_argument("--dir", required=True)
    content.add_argument("--cache", required=True, help="the node's hash cache (JSON)")
    content.add_argument("--hash", nargs="*", default=[],
                         help="files to hash, relative to --dir")


@dataclass
class ContentFile(Record):
    size: int
    sha256: str = ""        # empty when it was not asked for (or is not a regular file)


@dataclass
class ContentAnswer(Record):
    directory: str                      # as resolved on the node (absolute)
    exists: bool
    files: dict[str, ContentFile] = field(default_factory=dict)
    hashed: int = 0                     # files hashed now (the others came from the cache)
    hashed_bytes: int = 0


ANSWERS: dict[str, type[Record]] = {CONTENT: ContentAnswer}
