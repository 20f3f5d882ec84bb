"""One split's token shards written as tokens come (``mlxops data prepare``): a new shard
every ``--shard-tokens``, each under a temporary name until it is whole, hashed as it is
written, and put in place only when it differs from the shard of that name the last
preparation wrote (so an unchanged shard keeps its file, mtime and inode, and a launch
sends nothing for it)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import BinaryIO

import numpy as np

from mlxops.trainer import shardformat as sf

TMP_PREFIX = ".tmp-"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


class ShardWriter:
    """One split's shards: tokens appended as they come, a new shard every ``limit``.

    A shard is opened with the header of a full one (``limit`` tokens) and hashed as it is
    written, so a full shard is never read back; only the last, shorter one of a split gets
    its real header and is hashed again from the file."""

    def __init__(self, out: Path, split: str, dtype: str, limit: int,
                 previous: dict[str, sf.ShardInfo]):
        self.out, self.split, self.dtype, self.limit = out, split, dtype, limit
        self.previous = previous
        self.shards: list[sf.ShardInfo] = []
        self.written: list[str] = []
        self.kept: list[str] = []
        self._fh: BinaryIO | None = None
        self._count = 0
        self._hash = hashlib.sha256()

    def _tmp(self) -> Path:
        return self.out / f"{TMP_PREFIX}{sf.shard_name(self.split, len(self.shards))}"

    def _open(self) -> None:
        self._fh = open(self._tmp(), "wb")
        head = sf.header(self.dtype, self.limit)
        self._fh.write(head)
        self._hash = hashlib.sha256(head)
        self._count = 0

    def add(self, tokens: np.ndarray) -> None:
        at = 0
        while at < len(tokens):
            if self._fh is None:
                self._open()
            assert self._fh is not None
            take = min(len(tokens) - at, self.limit - self._count)
            self._hash.update(sf.write_tokens(self._fh, tokens[at:at + take], self.dtype))
            self._count += take
            at += take
            if self._count == self.limit:
                self._finish()

    def _finish(self) -> None:
        assert self._fh is not None
        tmp = self._tmp()
        name = sf.shard_name(self.split, len(self.shards))
        if self._count != self.limit:
            self._fh.seek(0)
            self._fh.write(sf.header(self.dtype, self._count))
        self._fh.close()
        self._fh = None
        sha = self._hash.hexdigest() if self._count == self.limit else file_sha256(tmp)
        info = sf.ShardInfo(name, sha, tmp.stat().st_size, self._count)
        final = self.out / name
        old = self.previous.get(name)
        if old == info and final.is_file() and final.stat().st_size == info.bytes:
            tmp.unlink()        # the same shard: the file (and its mtime) stays
            self.kept.append(name)
        else:
            os.replace(tmp, final)
            self.written.append(name)
        self.shards.append(info)

    def close(self) -> list[sf.ShardInfo]:
        if self._fh is not None and self._count:
            self._finish()
        return self.shards

    def abandon(self) -> None:
        """After an error (or a close): no temporary file left behind."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None
            self._tmp().unlink(missing_ok=True)
