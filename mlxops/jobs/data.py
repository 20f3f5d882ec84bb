"""A job's ``data:``: the prepared directory (``mlxops data prepare``) its trainer reads.

The job file names it (docs/job-file.md)::

    data: data/corpus                  # pushed to every node, under its root
    data: {path: data/corpus, shared: true}            # every node mounts this same path
    data: {path: data/corpus, shared: /Volumes/corpus} # ... mounted there on the nodes

Read when the job loads (bad input: one line naming the file and the key, before any host
is touched): the manifest must be readable, the trainer's ``model.vocab_size`` is the
manifest's (given otherwise: refused; not given: set), and ``trainer.data.source`` and
``path`` are mlxops's to set. At launch, pre-flight places the files on each node with
:mod:`mlxops.jobs.content` (hash-checked, only what differs travels; ``shared``: nothing
sent, the node's copy verified) and refuses a node whose copy differs; each rank's config
then reads the node's copy (``data.source: shards``, ``data.path``).

Which files a node gets: the manifest, the validation shards and the training shards its
ranks read. Every rank reads a slice of every global batch, and global batches walk the
whole training split, so that is every training shard for every node (the content module
sends a node any subset, should a reader ever partition shards by rank).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlxops.errors import bad_input
from mlxops.jobs.content import Content, prepared_data
from mlxops.trainer import shardformat
from mlxops.trainer.config import TrainerConfig

KEYS = ("path", "shared")


@dataclass(frozen=True)
class DataSpec:
    path: Path                  # the prepared directory on the controller (absolute)
    shared: str | None = None   # where every node mounts it; None: pushed to each node

    def to_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "shared": self.shared}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DataSpec:
        return cls(Path(data["path"]), data.get("shared"))

    def manifest(self) -> shardformat.Manifest:
        return shardformat.read_manifest(self.path)

    def content(self) -> Content:
        return prepared_data(self.path, self.shared)


def parse_data(job: Path, value: Any) -> DataSpec:
    """The ``data:`` key, its manifest read (so a bad one is refused now)."""
    if isinstance(value, str):
        value = {"path": value}
    if not isinstance(value, dict):
        raise bad_input(job, "data", "must be a prepared directory (mlxops data prepare), or "
                                     "a mapping of path: and shared:")
    for key in value:
        if key not in KEYS:
            raise bad_input(job, f"data.{key}", f"unknown key (known: {', '.join(KEYS)})")
    where = value.get("path")
    if not isinstance(where, str) or not where:
        raise bad_input(job, "data.path", "required: the directory mlxops data prepare wrote")
    path = (job.parent / where).resolve()
    shared = value.get("shared", False)
    if shared is True:
        shared = str(path)
    elif shared is False:
        shared = None
    elif not isinstance(shared, str) or not shared.startswith("/"):
        raise bad_input(job, "data.shared", f"must be true (the nodes mount it at the same "
                                            f"path) or the absolute path they mount it at, "
                                            f"got {shared!r}")
    spec = DataSpec(path, shared)
    try:
        spec.manifest()
    except shardformat.ShardError as exc:
        raise bad_input(job, "data", str(exc)) from None
    return spec


def apply_manifest(job: Path, data: DataSpec, trainer: TrainerConfig | None,
                   raw_trainer: Any) -> None:
    """The trainer config takes the manifest's vocabulary; what mlxops sets is refused."""
    if trainer is None:
        raise bad_input(job, "data", "goes with 'trainer:' (the bundled trainer reads the "
                                     "shards); your 'command:' reads its own data")
    raw_data = (raw_trainer or {}).get("data") or {}
    for key in ("source", "path"):
        if isinstance(raw_data, dict) and key in raw_data:
            raise bad_input(job, f"trainer.data.{key}", "is set by mlxops from 'data:' (the "
                                                        "prepared shards on each node)")
    vocab = data.manifest().vocab_size
    raw_model = (raw_trainer or {}).get("model") or {}
    given = raw_model.get("vocab_size") if isinstance(raw_model, dict) else None
    if given is not None and given != vocab:
        raise bad_input(job, "trainer.model.vocab_size", f"{given}, but the tokenizer of "
                                                         f"{data.path} has {vocab} tokens "
                                                         "(leave it out: it is taken from "
                                                         "the manifest)")
    trainer.model.vocab_size = vocab


def files_for_node(manifest: shardformat.Manifest) -> list[str]:
    """What a node of the job gets: see the module's docstring."""
    return [shardformat.MANIFEST, *(s.name for s in manifest.shards())]


def rank_data(config: dict[str, Any], node_dir: str) -> dict[str, Any]:
    """A rank's config (``trainer.json``) reading the node's copy of the shards."""
    data = dict(config.get("data") or {})
    data.update(source=shardformat.SHARDS_SOURCE, path=node_dir)
    return {**config, "data": data}
