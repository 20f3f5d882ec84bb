from mlxops.trainer.config import load_config
from mlxops.trainer.model import Transformer, count_params
from mlxops.trainer.plan import count_params as planned_params
from mlxops.trainer.plan import plan_memory

GB = 1024**3


def test_param_count_matches_model():
    for tie in (True, False):
        cfg = load_config({"model": {"dims": 64, "layers": 3, "heads": 4,
                                     "tie_embeddings": tie}})
        assert planned_params(cfg) == count_params(Transformer(cfg.model))


def test_small_model_fits_with_configured_micro_batch():
    p = plan_memory({"train": {"global_batch": 32, "micro_batch": 8}}, 16 * GB, 2)
    assert p.fits and (p.micro_batch, p.accumulation, p.grad_checkpoint) == (8, 2, False)
    assert p.optimizer_bytes == 2 * p.param_bytes
    assert p.micro_batch * p.accumulation * p.world_size == 32


def test_tight_memory_shrinks_micro_batch_then_checkpoints():
    big = {"model": {"dims": 2048, "layers": 24, "heads": 16, "seq_len": 2048},
           "train": {"global_batch": 64, "micro_batch": 16}}
    roomy = plan_memory(big, 512 * GB, 4)
    tight = plan_memory(big, 96 * GB, 4)
    assert roomy.fits and tight.fits
    assert (tight.micro_batch, tight.grad_checkpoint) < (roomy.micro_batch, True) or \
        tight.grad_checkpoint
    assert not plan_memory(big, 8 * GB, 4).fits
