"""``python -m mlxops.node send``: an answer line, then the files as a tar stream on stdout
(:mod:`mlxops.node.protocol.send`). Which checkpoint is sent is chosen here, on the node,
by the one rule of :func:`mlxops.node.protocol.layout.newest_checkpoint`."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import BinaryIO

from mlxops.node import protocol
from mlxops.node.protocol.send import SendAnswer

#: Bytes read and written at a time (tarfile's defaults, 10-16 KB, cost a call per block).
CHUNK = 1 << 20


def _files(directory: Path, names: list[str]) -> tuple[dict[str, int], str]:
    """``({name: bytes}, why not)``: ``names`` (every regular file under ``directory``,
    by relative path, when empty), each a regular file."""
    if not directory.is_dir():
        return {}, f"no directory {directory}"
    if not names:
        names = sorted(str(p.relative_to(directory)) for p in directory.rglob("*")
                       if p.is_file() and not p.is_symlink())
    found = {}
    for name in names:
        path = directory / name
        if not path.is_file():
            return {}, f"no {name} in {directory}"
        found[name] = path.stat().st_size
    return found, ""


def _step(directory: Path) -> int | None:
    try:
        step = json.loads((directory / protocol.CKPT_STATE).read_text()).get("step")
    except (OSError, ValueError, AttributeError):
        return None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def choose(run_dir: Path, where: str, step: int | None) -> tuple[Path | None, str]:
    """The checkpoint directory asked for, or None and why."""
    base = run_dir / where
    if step is None:
        chosen = protocol.newest_checkpoint(base)
        return chosen, "" if chosen else f"no complete checkpoint in {where}/"
    chosen = base / protocol.checkpoint_name(step)
    if protocol.checkpoint_complete(chosen):
        return chosen, ""
    return None, f"no complete checkpoint {where}/{chosen.name}"


def answer(directory: str, run_dir: str, where: str, step: int | None, names: list[str]
           ) -> tuple[SendAnswer, Path | None]:
    """What will be sent (the answer line) and from where (None: nothing)."""
    if run_dir:
        chosen, missing = choose(Path(run_dir), where, step)
        if chosen is None:
            return SendAnswer(directory="", missing=missing), None
        shown = str(chosen.relative_to(run_dir))
    else:
        chosen, shown = Path(directory), directory
    files, missing = _files(chosen, names)
    if missing:
        return SendAnswer(directory=shown, missing=missing), None
    return SendAnswer(directory=shown, files=files, step=_step(chosen)), chosen


def send(out: BinaryIO, *, directory: str = "", run_dir: str = "", where: str = "",
         step: int | None = None, names: list[str] | None = None) -> int:
    """Write the answer line, then (when it names no ``missing``) the files' tar to ``out``.
    The tar is written as read (``w|``: a block at a time, never a whole file in memory)."""
    said, chosen = answer(directory, run_dir, where, step, list(names or []))
    out.write((protocol.answer_line(said) + "\n").encode())
    out.flush()
    if chosen is None:
        return 0
    # dereference: each name a regular file with its bytes, as the answer line says. Without
    # it a file's second hard link (a fine-tuning checkpoint's adapters.safetensors and
    # model.safetensors are one file) goes as a link member, which every reader refuses.
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT, bufsize=CHUNK,
                      copybufsize=CHUNK, dereference=True) as tar:
        for name in said.files:
            tar.add(chosen / name, arcname=name, recursive=False)
    out.flush()
    return 0
