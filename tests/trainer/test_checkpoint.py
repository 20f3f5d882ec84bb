import mlx.core as mx

from mlxops.trainer import checkpoint


def save(d, step, keep=2):
    return checkpoint.save(d, step, {"w": mx.full((3,), step, mx.float32)},
                           {"step": mx.array(step, mx.uint64)}, {"step": step}, keep)


def test_save_load_latest_and_prune(tmp_path):
    for s in (10, 20, 30):
        save(tmp_path, s)
    assert [p.name for p in checkpoint.list_complete(tmp_path)] == ["step-00000020",
                                                                     "step-00000030"]
    assert (tmp_path / "latest").read_text().strip() == "step-00000030"
    w, o, st = checkpoint.load(checkpoint.find_latest(tmp_path))
    assert w["w"].tolist() == [30.0] * 3 and o["step"].item() == 30 and st["step"] == 30


def test_half_written_checkpoints_are_ignored(tmp_path):
    save(tmp_path, 10)
    # a kill mid-write leaves a temporary directory, or a directory without state.json
    (tmp_path / ".tmp-step-00000020-999").mkdir()
    broken = tmp_path / "step-00000030"
    broken.mkdir()
    (broken / "model.safetensors").write_text("partial")
    assert checkpoint.find_latest(tmp_path).name == "step-00000010"
    (tmp_path / "latest").write_text("step-00000030\n")
    assert checkpoint.find_latest(tmp_path).name == "step-00000010"
    save(tmp_path, 40, keep=5)
    assert not (tmp_path / ".tmp-step-00000020-999").exists()
