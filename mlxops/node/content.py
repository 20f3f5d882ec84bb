"""The node's side of placing large files: what a directory holds, hashed through a cache.

A launch asks this of every node before it sends shards or a base model, and again after;
hashing GBs each time would cost more than the launch. So each file's sha256 is kept in the
node's hash cache (``<root>/cache/content-hashes.json``) with the size, mtime and inode it
was hashed at, and read from there while all three are unchanged: rsync's quick check,
keyed by the inode too, so a file replaced by a rename (how ``tar`` and ``mlxops data
prepare`` write) is hashed again even when its size and mtime happen to match. A file
changed in place within the same second, keeping its size, would not be seen: the cache
goes when the file's entry does (``rm`` the cache file to hash everything again).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path

from mlxops.node.protocol.content import ContentAnswer, ContentFile

_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _load_cache(path: Path) -> dict[str, list]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}   # none yet, or damaged: hash again
    return data if isinstance(data, dict) else {}


def _save_cache(path: Path, cache: dict[str, list]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".content-hashes.")
    with os.fdopen(fd, "w") as fh:
        json.dump(cache, fh, sort_keys=True)
    os.replace(tmp, path)


def _walk(directory: Path) -> Iterable[tuple[str, os.stat_result]]:
    for dirpath, dirnames, filenames in os.walk(directory):
        dirnames.sort()
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            if stat.S_ISREG(st.st_mode):
                yield os.path.relpath(full, directory), st


def listing(directory: Path, cache_file: Path, hash_names: Iterable[str]) -> ContentAnswer:
    """Every regular file under ``directory`` with its size; the sha256 of ``hash_names``."""
    directory = Path(os.path.abspath(directory))
    answer = ContentAnswer(directory=str(directory), exists=directory.is_dir())
    if not answer.exists:
        return answer
    wanted = set(hash_names)
    cache = _load_cache(cache_file)
    changed = False
    for rel, st in _walk(directory):
        entry = ContentFile(size=st.st_size)
        if rel in wanted:
            full = str(directory / rel)
            key = [st.st_size, st.st_mtime_ns, st.st_ino]
            known = cache.get(full)
            if isinstance(known, list) and known[:3] == key and len(known) == 4:
                entry.sha256 = known[3]
            else:
                entry.sha256 = sha256_file(directory / rel)
                cache[full] = [*key, entry.sha256]
                answer.hashed += 1
                answer.hashed_bytes += st.st_size
                changed = True
        answer.files[rel] = entry
    # Entries of files gone from this directory go too, so the cache does not grow forever.
    prefix = str(directory) + os.sep
    gone = [k for k in cache if k.startswith(prefix) and k[len(prefix):] not in answer.files]
    for key in gone:
        del cache[key]
    if changed or gone:
        _save_cache(cache_file, cache)
    return answer
