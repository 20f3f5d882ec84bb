"""A run's checkpoint parts on this node: listed, and received from the controller
(:mod:`mlxops.node.protocol.parts` says what a part is).

Listing reads only what is cheap: a stage's ``state.json`` for its number of stages and
its layers, a
slice file's safetensors header (8 bytes of length, then JSON) for ``zero_world``. A part
of an incomplete checkpoint (the node protocol's one rule, ``checkpoint_complete``) is not
listed: it cannot be resumed from.

Receiving never leaves half a part: the tar is unpacked into ``ckpt/.incoming-<pid>/``,
every file checked against the size the controller named (a name it did not name, a link,
an absolute path or ``..`` is refused), flushed to disk, and only then is each part renamed
into place; a part already there is moved aside first and removed after. The temporary
directory goes whatever happens.

Standard library only (synced to nodes).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import tarfile
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from mlxops.node import protocol
from mlxops.node.protocol.parts import (
    STAGE,
    STAGE_DIR,
    ZERO,
    ZERO_FILE,
    CkptPart,
    PartsAnswer,
    ReceiveAnswer,
)
from mlxops.node.tarstream import NotNamed, WrongSize, plain_name, unpack_named


class ReceiveError(RuntimeError):
    """What came is not exactly the files named (nothing was placed)."""


def _int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _stage_state(checkpoint: Path, index: int) -> tuple[int | None, list[int]]:
    """A stage checkpoint's number of stages and its layers ``[first, end)`` ([] unknown)."""
    try:
        state = json.loads((checkpoint / protocol.CKPT_STATE).read_text())
        world = state.get("world_size")
        stages = state.get("config", {}).get("train", {}).get("stages")
    except (OSError, ValueError, AttributeError):
        return None, []
    if not _int(world):
        return None, []
    if not (isinstance(stages, list) and len(stages) == world and all(map(_int, stages))):
        return world, []
    first = sum(stages[:index])
    return world, [first, first + stages[index]] if index < world else []


def safetensors_metadata(path: Path) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors file's header ({} when unreadable)."""
    try:
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > 100 << 20:
                return {}
            header = json.loads(f.read(length))
    except (OSError, ValueError, struct.error):
        return {}
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    return meta if isinstance(meta, dict) else {}


def _files(ckpt: Path, path: Path) -> dict[str, int]:
    found = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file())
    return {p.relative_to(ckpt).as_posix(): p.stat().st_size for p in found}


def _stage_parts(ckpt: Path) -> list[CkptPart]:
    out = []
    for stage_dir in sorted(ckpt.glob(STAGE_DIR.format(index="*"))):
        index = stage_dir.name.rpartition("-")[2]
        if not index.isdigit():
            continue
        for checkpoint in protocol.complete_checkpoints(stage_dir):
            world, layers = _stage_state(checkpoint, int(index))
            step = protocol.checkpoint_step(checkpoint.name)
            if world is None or step is None:
                continue
            out.append(CkptPart(STAGE, int(index), world, step,
                                checkpoint.relative_to(ckpt).as_posix(),
                                _files(ckpt, checkpoint), layers))
    return out


def _zero_parts(ckpt: Path) -> list[CkptPart]:
    out = []
    for checkpoint in protocol.complete_checkpoints(ckpt):
        step = protocol.checkpoint_step(checkpoint.name)
        for path in sorted(checkpoint.glob(ZERO_FILE.format(index="*"))):
            meta = safetensors_metadata(path)
            try:
                index, world = int(meta["zero_rank"]), int(meta["zero_world"])
            except (KeyError, ValueError):
                continue
            if step is None or path.name != ZERO_FILE.format(index=index):
                continue
            out.append(CkptPart(ZERO, index, world, step, path.relative_to(ckpt).as_posix(),
                                _files(ckpt, path)))
    return out


def list_parts(run_dir: Path) -> PartsAnswer:
    """Every part of a complete checkpoint under ``run_dir/ckpt``."""
    ckpt = run_dir / protocol.CKPT_DIR
    if not ckpt.is_dir():
        return PartsAnswer()
    return PartsAnswer(_stage_parts(ckpt) + _zero_parts(ckpt))


def _safe(name: str) -> bool:
    """A plain relative name, none of whose parts is hidden (``.incoming-*`` and the like
    are this module's own)."""
    return plain_name(name) and not any(p.startswith(".") for p in PurePosixPath(name).parts)


def receive(run_dir: Path, parts: list[str], files: dict[str, int], stream: BinaryIO
            ) -> ReceiveAnswer:
    """Unpack the tar on ``stream`` (exactly ``files``) and rename ``parts`` into place."""
    ckpt = run_dir / protocol.CKPT_DIR
    bad = [n for n in [*parts, *files] if not _safe(n)]
    if bad:
        raise ReceiveError(f"not a plain relative name: {bad[0]!r}")
    lone = [n for n in files if not any(n == p or n.startswith(p + "/") for p in parts)]
    if lone:
        raise ReceiveError(f"{lone[0]}: in no part named")
    ckpt.mkdir(parents=True, exist_ok=True)
    incoming = ckpt / f".incoming-{os.getpid()}"
    shutil.rmtree(incoming, ignore_errors=True)
    incoming.mkdir()
    try:
        written = _unpack(stream, incoming, files)
        placed = []
        for part in parts:
            _place(incoming / part, ckpt / part)
            placed.append(part)
        return ReceiveAnswer(placed, written)
    finally:
        shutil.rmtree(incoming, ignore_errors=True)


def _unpack(stream: BinaryIO, into: Path, files: dict[str, int]) -> int:
    try:
        got = unpack_named(stream, files, into, durable=True)
    except NotNamed as exc:
        raise ReceiveError(f"the tar holds {exc.name!r}, not one of the files named") from None
    except WrongSize as exc:
        raise ReceiveError(f"{exc.name}: {exc.sent} bytes sent, {exc.named} named") from None
    except tarfile.TarError as exc:
        raise ReceiveError(f"the files came damaged: {exc}") from None
    lacking = [name for name in files if name not in got]
    if lacking:
        raise ReceiveError(f"the stream ended before {lacking[0]}")
    return sum(got.values())


def _place(source: Path, target: Path) -> None:
    """Rename ``source`` to ``target``; one already there is moved aside, then removed."""
    if not source.exists():
        raise ReceiveError(f"{source.name}: no file of it came")
    target.parent.mkdir(parents=True, exist_ok=True)
    aside = None
    if target.exists():
        aside = target.with_name(f".replaced-{target.name}-{os.getpid()}")
        os.replace(target, aside)
    os.replace(source, target)
    if aside is not None:
        if aside.is_dir():
            shutil.rmtree(aside, ignore_errors=True)
        else:
            aside.unlink(missing_ok=True)
