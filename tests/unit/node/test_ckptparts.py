"""A node's checkpoint parts (mlxops/node/ckptparts.py): listed from a run directory, and
received as a tar that is placed whole or not at all."""

from __future__ import annotations

import io
import json
import struct
import tarfile
from pathlib import Path

import pytest

from mlxops.node.ckptparts import ReceiveError, list_parts, receive


def checkpoint(d: Path, world: int, extra: dict[str, bytes] | None = None) -> None:
    d.mkdir(parents=True)
    for name in ("model.safetensors", "optimizer.safetensors"):
        (d / name).write_bytes(b"x" * 8)
    (d / "state.json").write_text(json.dumps({"step": 3, "world_size": world, "config": {
        "train": {"stages": [2, 1, 3] if world == 3 else None}}}))
    for name, data in (extra or {}).items():
        (d / name).write_bytes(data)


def safetensors(meta: dict[str, str]) -> bytes:
    header = json.dumps({"__metadata__": meta}).encode()
    return struct.pack("<Q", len(header)) + header


def tar_of(files: dict[str, bytes]) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    return buf


def test_stage_directories_and_zero_slices_are_listed_incomplete_ones_not(tmp_path):
    ckpt = tmp_path / "ckpt"
    checkpoint(ckpt / "stage-1" / "step-00000003", world=3)
    (ckpt / "stage-1" / "step-00000004").mkdir()  # being written: not complete
    slice_ = safetensors({"zero_rank": "2", "zero_world": "3"})
    checkpoint(ckpt / "step-00000005", world=3, extra={"zero-rank-2.safetensors": slice_})
    parts = {(p.kind, p.index, p.world, p.step, p.path, *p.layers): p.files
             for p in list_parts(tmp_path).parts}
    assert parts == {   # stage 1 of train.stages [2, 1, 3]: layers [2, 3)
        ("stage", 1, 3, 3, "stage-1/step-00000003", 2, 3): {
            "stage-1/step-00000003/model.safetensors": 8,
            "stage-1/step-00000003/optimizer.safetensors": 8,
            "stage-1/step-00000003/state.json": 72},
        ("zero", 2, 3, 5, "step-00000005/zero-rank-2.safetensors"): {
            "step-00000005/zero-rank-2.safetensors": len(slice_)},
    }


def test_a_received_part_is_renamed_into_place_whole_and_a_short_one_places_nothing(tmp_path):
    files = {"stage-2/step-00000003/model.safetensors": b"abc",
             "stage-2/step-00000003/state.json": b"{}"}
    sizes = {k: len(v) for k, v in files.items()}
    with pytest.raises(ReceiveError, match="ended before"):
        receive(tmp_path, ["stage-2/step-00000003"], sizes,
                tar_of(dict(list(files.items())[:1])))
    assert not (tmp_path / "ckpt" / "stage-2").exists()
    assert [p.name for p in (tmp_path / "ckpt").iterdir()] == []  # no temporary left
    with pytest.raises(ReceiveError, match="not a plain relative name"):
        receive(tmp_path, ["../x"], {"../x": 1}, tar_of({"../x": b"1"}))
    got = receive(tmp_path, ["stage-2/step-00000003"], sizes, tar_of(files))
    assert got.placed == ["stage-2/step-00000003"] and got.bytes == 5
    assert (tmp_path / "ckpt/stage-2/step-00000003/model.safetensors").read_bytes() == b"abc"
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["stage-2"]
