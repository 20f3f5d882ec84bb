"""A directory of large files a job reads, placed on its nodes: prepared token shards, a
fine-tuning base model.

The policy, per node:

* **Where.** Under the node root, ``<root>/data/<dir name>-<8 hex>``: the hex is of the
  directory's absolute path on the controller, so two prepared directories of the same
  name never share a place, and a directory prepared again lands where its old copy is
  (only the shards that changed travel). Or, when the user says every node mounts the same
  path (``shared``), that path itself: nothing is sent, the node's copy is only verified.
* **What.** The files the caller names for the node (``wanted``: a node gets only the
  shards its ranks read; all of them when not said), always checked against the sha256
  the controller holds: for prepared data, the manifest's own hashes (nothing is hashed on
  the controller); for any other directory, its files hashed once per version, by size and
  mtime, in a cache under ``~/.mlxops/cache``.
* **How.** One ``content`` listing per node (:mod:`mlxops.node.content`: hashes read from
  the node's cache while a file is unchanged), then one command that deletes what the
  directory should not hold and unpacks, from stdin, a tar of the missing and differing
  files (:func:`mlxops.sync.apply_command`, the code sync's own), then a second listing of
  what was sent, which hashes it on the node.
* **Refused.** A node whose copy still differs after that (or, ``shared``, differs at all)
  is a pre-flight problem naming the host, the file and the two hashes: nothing starts.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from mlxops import archive, paths
from mlxops.errors import MlxopsError
from mlxops.node.protocol import layout
from mlxops.node.protocol.content import ContentAnswer, content_args
from mlxops.sync import apply_command
from mlxops.trainer import shardformat
from mlxops.transport import Connection, nodecmd


class ContentError(MlxopsError):
    """A node that could not receive the files, or holds a copy that differs."""


@dataclass(frozen=True)
class Content:
    """A directory of large files: every file's sha256 and size, by relative path."""

    local: Path
    files: Mapping[str, tuple[str, int]]
    shared: str | None = None   # the absolute path every node mounts it at, else None

    def node_dir(self, root: str) -> str:
        """Where the node reads it: the shared path, or its place under ``root``."""
        if self.shared:
            return self.shared
        tag = hashlib.sha256(str(self.local.resolve()).encode()).hexdigest()[:8]
        return f"{root}/{layout.DATA_DIR}/{self.local.resolve().name}-{tag}"


@dataclass
class PlaceReport:
    """What one node got: the files sent, deleted, and the bytes."""

    sent: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    bytes_sent: int = 0
    hashed_bytes: int = 0       # hashed on the node now (the rest came from its cache)
    node_dir: str = ""


# --- the controller's side ------------------------------------------------------------------


def prepared_data(directory: Path, shared: str | None = None) -> Content:
    """A ``mlxops data prepare`` directory: its shards by the manifest's hashes, and the
    manifest itself (hashed: it is small)."""
    directory = Path(directory)
    manifest = shardformat.read_manifest(directory)
    files = {s.name: (s.sha256, s.bytes) for s in manifest.shards()}
    manifest_path = directory / shardformat.MANIFEST
    files[shardformat.MANIFEST] = (_sha256(manifest_path), manifest_path.stat().st_size)
    return Content(directory, files, shared)


def any_directory(directory: Path, shared: str | None = None,
                  cache_file: Path | None = None) -> Content:
    """Every regular file under ``directory`` (a base model), hashed through the
    controller's cache (by path, size and mtime): a GB model is hashed once, not per launch."""
    directory = Path(directory)
    cache_file = cache_file or paths.controller_home() / "cache" / "content-hashes.json"
    cache = _load_json(cache_file)
    files, changed = {}, False
    for dirpath, dirnames, filenames in os.walk(directory):
        dirnames.sort()
        for name in sorted(filenames):
            full = Path(dirpath) / name
            st = full.stat()
            key = [st.st_size, st.st_mtime_ns]
            known = cache.get(str(full))
            if not (isinstance(known, list) and known[:2] == key and len(known) == 3):
                known = [*key, _sha256(full)]
                cache[str(full)] = known
                changed = True
            files[full.relative_to(directory).as_posix()] = (known[2], st.st_size)
    if changed:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_file.with_name(cache_file.name + f".{os.getpid()}")
        tmp.write_text(json.dumps(cache, sort_keys=True))
        os.replace(tmp, cache_file)
    return Content(directory, files, shared)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _load_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


# --- comparing with a node's copy -----------------------------------------------------------


def differences(content: Content, answer: ContentAnswer, wanted: Collection[str]
                ) -> dict[str, str]:
    """``{file: what is wrong}`` for each wanted file the node lacks or holds otherwise."""
    out = {}
    for name in sorted(wanted):
        sha, size = content.files[name]
        have = answer.files.get(name)
        if have is None:
            out[name] = "missing"
        elif have.size != size:
            out[name] = f"{have.size} bytes, want {size}"
        elif have.sha256 != sha:
            out[name] = f"sha256 {have.sha256[:12]}, want {sha[:12]}"
    return out


def missing_bytes(content: Content, answer: ContentAnswer) -> int:
    """The bytes of ``content``'s files the node's copy lacks or holds at another size:
    what placing it would send at the most (a file of the same size may still differ:
    pre-flight compares the hashes)."""
    return sum(size for name, (_, size) in content.files.items()
               if (have := answer.files.get(name)) is None or have.size != size)


def problems(host: str, content: Content, answer: ContentAnswer, wanted: Collection[str]
             ) -> list[str]:
    """Pre-flight's lines for a node whose copy differs: nothing may start on it."""
    if not answer.exists:
        return [f"{host}: {answer.directory}: no such directory (the data of "
                f"{content.local})"]
    found = differences(content, answer, wanted)
    if not found:
        return []
    shown = "; ".join(f"{name}: {what}" for name, what in list(found.items())[:3])
    more = f" (and {len(found) - 3} more)" if len(found) > 3 else ""
    return [f"{host}: {answer.directory} differs from {content.local}: {shown}{more}"]


# --- on a node ------------------------------------------------------------------------------


def ask(conn: Connection, python: str, root: str, content: Content,
        wanted: Collection[str]) -> ContentAnswer:
    """The node's listing of its copy, the ``wanted`` files hashed (through its cache)."""
    args = content_args(content.node_dir(root), f"{root}/{layout.CONTENT_HASHES}",
                        sorted(wanted))
    answer = nodecmd.run_node(conn, python, f"{root}/{layout.CODE_DIR}", args, timeout=3600)
    assert isinstance(answer, ContentAnswer), answer
    return answer


def place(conn: Connection, python: str, root: str, content: Content,
          wanted: Collection[str] | None = None) -> tuple[PlaceReport, list[str]]:
    """Make the node's copy hold ``wanted`` (all files when None) as the controller has
    them; returns what was done and the problems left (empty: the copy is verified)."""
    wanted = sorted(content.files if wanted is None else wanted)
    unknown = [w for w in wanted if w not in content.files]
    if unknown:
        raise ValueError(f"not files of {content.local}: {unknown}")
    answer = ask(conn, python, root, content, wanted)
    report = PlaceReport(node_dir=answer.directory, hashed_bytes=answer.hashed_bytes)
    if content.shared:
        return report, problems(conn.name, content, answer, wanted)
    report.sent = sorted(differences(content, answer, wanted))
    keep = set(wanted)
    report.deleted = sorted(name for name in answer.files if name not in keep)
    if not report.sent and not report.deleted:
        return report, []
    send = [archive.Entry(name, content.local / name) for name in report.sent]
    stream = archive.write(send) if send else None
    if stream is not None:
        stream.seek(0, os.SEEK_END)
        report.bytes_sent = stream.tell()
        stream.seek(0)
    try:
        dirs = sorted({posixpath.dirname(n) for n in report.deleted} - {""}, reverse=True)
        result = conn.run(apply_command(report.node_dir, report.deleted, dirs, bool(send)),
                          stdin=stream, timeout=None)
    finally:
        if stream is not None:
            stream.close()
    if not result.ok:
        raise ContentError(f"{conn.name}: cannot place {content.local} in "
                           f"{report.node_dir}: {result.error_line()}")
    if not report.sent:
        return report, []
    # What arrived is hashed on the node (and cached): the copy is verified, not assumed.
    after = ask(conn, python, root, content, wanted)
    report.hashed_bytes += after.hashed_bytes
    return report, problems(conn.name, content, after, wanted)


def place_contents(conn: Connection, python: str, root: str, wanted: list[Content]
                   ) -> list[str]:
    """A workload's contents (:meth:`mlxops.jobs.workloads.Workload.contents`) on one node:
    make the node's copies equal the controller's (only what differs travels); the
    pre-flight problems of a copy that still differs (empty: every copy verified)."""
    problems = []
    for content in wanted:
        _, left = place(conn, python, root, content)
        problems += left
    return problems
