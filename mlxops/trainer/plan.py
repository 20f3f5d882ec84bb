"""Memory plan: what one rank holds, and the micro-batch / accumulation / checkpointing to use.

Pure standard library, so the controller can print it (``mlxops plan JOB``) without mlx.
Estimates per rank, in bytes:

- parameters: fp32 master weights, 4 B each (plus a 2 B bf16 copy with ``dtype: bfloat16``)
- gradients: fp32, 4 B each, twice when accumulating (the running sum and the new micro-step)
- optimizer: AdamW's two fp32 moments, 8 B each
- activations of one micro-batch: per layer ~``(10*dims + 3*ffn) * B*T`` saved elements
  (norm inputs, q/k/v, attention output, SwiGLU gate/up/product) plus the fused attention's
  ``heads*B*T`` softmax statistics; with gradient checkpointing only each layer's input is
  kept and one layer at a time is recomputed. The float32 logits, their softmax and their
  gradient (``3*B*T*vocab*4``) come on top.

Only a fraction of a node's memory is usable (macOS wires at most ~75% for the GPU by
default); ``usable_fraction`` says how much we allow ourselves.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .config import TrainerConfig, load_config

USABLE_FRACTION = 0.75
OVERHEAD = 1.10  # allocator slack and temporaries the estimate does not itemise


@dataclass
class MemoryPlan:
    params: int            # number of parameters
    param_bytes: int       # per rank
    grad_bytes: int
    optimizer_bytes: int
    activation_bytes: int  # for the suggested micro-batch
    total_bytes: int
    budget_bytes: int      # usable memory of this rank
    micro_batch: int
    accumulation: int
    grad_checkpoint: bool
    fits: bool
    world_size: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def count_params(cfg: TrainerConfig) -> int:
    m = cfg.model
    d, f, v = m.dims, m.hidden(), m.vocab_size
    per_layer = 4 * d * d + 3 * d * f + 2 * d
    head = 0 if m.tie_embeddings else v * d
    return v * d + m.layers * per_layer + d + head


def activation_bytes(cfg: TrainerConfig, micro: int, grad_checkpoint: bool) -> int:
    m = cfg.model
    bt = micro * m.seq_len
    width = 2 if cfg.train.dtype == "bfloat16" else 4
    per_layer = (bt * (10 * m.dims + 3 * m.hidden()) + m.heads * bt) * width
    if grad_checkpoint:
        layers = m.layers * bt * m.dims * width + per_layer
    else:
        layers = m.layers * per_layer
    logits = 3 * bt * m.vocab_size * 4
    return layers + logits


def plan_memory(
    config: TrainerConfig | dict[str, Any],
    memory_bytes: int,
    world_size: int,
    ranks_per_node: int = 1,
    usable_fraction: float = USABLE_FRACTION,
    per_rank: int | None = None,
) -> MemoryPlan:
    """Plan one rank on a node with ``memory_bytes`` of memory shared by ``ranks_per_node``.

    ``per_rank``: the rank's sequences per step when ``train.balance`` gives it its own
    share (trainer/balance.py); by default ``global_batch / world_size``.

    The suggested micro-batch is the largest divisor of the per-rank batch that fits, first
    without gradient checkpointing, then with it; ``fits`` is False if even micro-batch 1
    with checkpointing does not.
    """
    cfg = config if isinstance(config, TrainerConfig) else load_config(config)
    t = cfg.train
    n = count_params(cfg)
    budget = int(memory_bytes * usable_fraction / max(1, ranks_per_node))
    per_rank = per_rank or max(1, t.global_batch // world_size)
    divisors = [d for d in range(per_rank, 0, -1) if per_rank % d == 0]
    param_b = n * (6 if t.dtype == "bfloat16" else 4)
    opt_b = 8 * n

    def total(micro: int, ckpt: bool) -> tuple[int, int, int]:
        grad_b = 4 * n * (2 if per_rank // micro > 1 else 1)
        act = activation_bytes(cfg, micro, ckpt)
        return int((param_b + grad_b + opt_b + act) * OVERHEAD), grad_b, act

    # Respect the configured choices first: micro_batch is an upper bound, and a config
    # that asks for checkpointing keeps it.
    candidates = [d for d in divisors if d <= t.micro_batch] or [1]
    for ckpt in ([t.grad_checkpoint] if t.grad_checkpoint else [False, True]):
        for micro in candidates:
            tot, grad_b, act = total(micro, ckpt)
            if tot <= budget:
                return MemoryPlan(n, param_b, grad_b, opt_b, act, tot, budget, micro,
                                  per_rank // micro, ckpt, True, world_size)
    tot, grad_b, act = total(1, True)
    return MemoryPlan(n, param_b, grad_b, opt_b, act, tot, budget, 1, per_rank, True, False,
                      world_size)
