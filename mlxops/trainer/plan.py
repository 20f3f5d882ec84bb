"""Memory plan: the peak one rank reaches, and the micro-batch / accumulation / checkpointing
that keep it within its node's budget.

Standard library only: the controller prints it (``mlxops plan JOB``, ``mlxops check
--job``) without mlx, and the trainer logs it beside what MLX measured (``planned_memory``
and ``peak_memory`` in ``metrics.jsonl``).

**What is estimated** is the peak of MLX's allocator (``mx.get_peak_memory()``) over a run
of the bundled trainer: the arrays alive at once, not the process's resident size. The
terms are what a step holds; their weights were measured, not derived: MLX frees an array
when its last user has run, and it runs up to 20 independent branches of a graph side by
side (``MLX_BFS_MAX_WIDTH``), so how many copies of each are alive at the peak depends on
its scheduling. ``benchmarks/memory.py`` runs the trainer over a grid of widths, depths,
heads, sequence lengths, vocabularies, micro-batches, accumulation, compute dtypes,
gradient checkpointing, world sizes and all-reduce dtypes, and the weights below were
fitted to 384 such runs: the plan is 0.90 to 1.20 times the measured peak there (median
1.015), above 1.15 in 3 (tiny models in bfloat16 on 2 ranks). The README gives the
figures of a grid drawn afresh; ``tests/trainer/test_plan.py`` holds 9 runs in the suite.

**Notation**, per rank: P parameters; N = micro_batch x seq_len tokens of one micro-batch;
D dims, F the SwiGLU width, H heads, T seq_len, V vocabulary, L layers; w = 4 bytes per
activation in float32, 2 in bfloat16. Weights, gradients and AdamW's moments are float32
whatever the compute dtype.

**A step peaks at one of two moments**, and the plan is the larger. In bytes:

the top of one micro-batch's forward/backward pass::

    12 P                        weights (4) and AdamW's two moments (8), alive all along
  + G P                         gradients already made
  + BF16 P      (bfloat16)      the weights' bfloat16 copy the pass runs on, and its
                                bfloat16 gradients
  + ACCUMULATE P (accumulating) the running sum of the micro-batches' gradients
  + L x layer                   what every layer keeps for its backward pass:
      layer = w N (A_D D + A_F F  its norms, q/k/v, RoPE, attention output, SwiGLU
                                  gate/up/product: A_D arrays D wide, A_F F wide, a token
                   + A_S H T)     and the attention probabilities, H x T a token (T x T a
                                  head): MLX's CPU and Metal training paths both materialise
                                  them, the seq^2 term
    with grad_checkpoint instead: CHECKPOINT w N D a layer (its input) and one layer
                                  recomputed, sometimes two side by side (RECOMPUTED more)
  + w N (X_D D + X_F F + X_S H T) the layer being differentiated: its gradients, the
                                  softmax's backward
  + LOGITS N V (+ LOGITS_BF16 N V in bfloat16)   the float32 logits, their softmax and
                                  gradient: the cross-entropy is float32 in any dtype
  + T^2        (model.window W, 0 < W < T)   the window's boolean mask, one for every
                                  layer; the attention probabilities stay H x T a token: the
                                  fused kernel given a mask computes every key and masks

the optimizer update after the last micro-batch::

    12 P                        the weights and moments before the step: the trainer keeps
                                them until the step is known good (the out-of-memory
                                back-off undoes a failed step)
  + U P (+ U_BF16 P)            the new weights and moments, the gradients they are made of
  + R P x min(1, 20 / arrays)^2 (2 ranks or more) the all-reduce's buffers (gradients
                                concatenated, summed, averaged; R_BF16 with a bfloat16 wire):
                                all of them at once when the model has few weight arrays
                                (7 a layer, 2 more), fewer as arrays outnumber MLX's 20
                                branches side by side
  + EMBED_LEFT V D + LOGITS_LEFT N V   (one rank, no accumulation: the update is then in the
                                backward pass's graph) the tied embedding's gradients and the
                                logits' buffers, not yet released when it starts

**Backends.** The weights above were fitted on MLX's CPU build and are the plan for
``metal`` and ``cpu``; MLX's CUDA build keeps other amounts (:data:`TERMS`, fitted by
``benchmarks/gpu_fit.py``'s linear programs to an H200's runs in ``benchmarks/gpu_data/``:
issue 33's table held within 0.90-1.15 of its peaks, every other run at 0.90 or more, the
largest excess over 1.15 minimised), and three more terms, 0 on a CPU::

  + G_CHECKPOINT P   (grad_checkpoint)  the checkpointed pass peaks late in the backward
                     pass, with most of the gradients made
  + w N X_HD D hd / 64  (hd = D / H, the head's width)  the pass keeps more per token at
                     head width 128 than at 64 (bfloat16; cuDNN's attention, not traced)
  + U_LAYER L P      (at the update)  the update holds more per parameter in a deeper
                     model (bfloat16: 36.7 P at 8 layers, 44.3 P at 16)

:func:`estimate` takes the backend; the controller plans for ``metal`` (a job's hosts are
Macs), the trainer for the one it computes on.

**Sharded optimizer state** (ZeRO-1, :mod:`mlxops.trainer.zero`; ``shard=True``, n ranks):
AdamW's moments are ``8 P / n`` and, in bfloat16, the model holds bfloat16 weights (``2
P``) beside its ``4 P / n`` float32 master slice, so the state is ``4 P + 8 P / n``
(float32) or ``2 P + 12 P / n`` (bfloat16) instead of ``12 P``
(:func:`sharded_terms`). The two moments shift by as much; besides, in bfloat16 the pass
makes no bfloat16 copy of the weights (they are bfloat16 already: ``BF16`` counts half),
and the update makes new moments for the slice only (``8 P`` of ``U`` becomes ``8 P /
n``), holds ``SLICE_ARRAYS`` float32 arrays of the slice's size at its peak (its new
weights, its gradients and weights copied out for the optimizer, the optimizer's
intermediates; one fewer in bfloat16) and gathers the new weights (``w P``, in place of
``U``'s new float32 weights). These terms are derived from the fitted ones above but for
``SLICE_ARRAYS``, fitted to three float32 runs of ``benchmarks/zero.py`` (5.3M
parameters on 2 and 3 ranks, 22.7M on 3, the last also measured through the run loop on
sandbox nodes); bfloat16 is not measured yet.

**Budget.** On a Mac, MLX's Metal allocator works within the GPU's recommended working set
(``mx.device_info()["max_recommended_working_set_size"]``: 74% of a 16 GB M3's RAM and
84% of a 128 GB M5 Max's by default, as their owners reported (README); raised by ``sysctl
iogpu.wired_limit_mb``). The node reports it (mlxops/node/memory.py) and the node's ranks
share it. MLX's CPU build has no such figure: the budget there is 80% of RAM, the memory
limit MLX's CPU allocator sets itself (``mx.get_memory_limit()``; recorded, not enforced).

Writing a checkpoint and the consistency check measured no higher than the step. Not
included: a consistency repair (``train.consistency_every`` found ranks that differ:
rank 0's state is sent to all, about twice the state for a moment) and a resume's loading
of a checkpoint, both rare; the compile cache and the Python process, which are not MLX
arrays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .config import TrainerConfig, load_config
from .plansearch import PlanFields, search, trainer_micro_batches

#: Bytes per parameter of the state: float32 weights and AdamW's two float32 moments.
STATE = 12
#: Without a recommended working set (MLX's CPU build), the share of RAM the plan may use:
#: MLX's CPU allocator sets its memory limit at 80% of RAM (mlx/backend/no_gpu/allocator.cpp).
CPU_FRACTION = 0.80
#: MLX evaluates up to this many independent branches of a graph side by side.
MLX_BFS_WIDTH = 20

# The terms' weights, fitted to measured peaks (benchmarks/memory.py; the module's
# docstring says what each counts). Bytes per parameter:
G = 1.8            # gradients already made when the backward pass peaks
BF16 = 4.0         # bfloat16 compute: the weights' bfloat16 copy, bfloat16 gradients
ACCUMULATE = 2.0   # accumulating: the running sum of the micro-batches' gradients
U = 16.0           # the update: new weights and moments, the gradients they are made of
U_BF16 = 1.2       # ... with bfloat16 compute
R = 7.3            # the all-reduce's buffers at full size, float32 on the wire
R_BF16 = 9.1       # ... bfloat16 on the wire (cast, summed, cast back)
# Arrays (w bytes an element) a token keeps in every layer: D wide, F wide, H x T:
A_D, A_F, A_S = 12.8, 6.2, 1.1
CHECKPOINT = 2.4   # with grad_checkpoint instead: D wide, the layer's input
RECOMPUTED = 0.47  # with grad_checkpoint: layers recomputed side by side, past one
# ... and in the layer being differentiated:
X_D, X_F, X_S = 25.6, 3.1, 1.7
# Bytes per logit (N x V): float32 logits, softmax and gradient; bfloat16's extra copy:
LOGITS, LOGITS_BF16 = 14.3, 3.0
# ZeRO-1's update: float32 arrays of a rank's slice's size alive at its peak (one fewer in
# bfloat16, whose master slice is kept, not cut from the weights); fitted to the measured
# peaks of benchmarks/zero.py at 2 and 3 ranks and of a run loop on 3 sandbox nodes
# (benchmarks/README.md; the plan 1.00 to 1.12 times them, never below).
SLICE_ARRAYS = 4
# Left over when the update starts, with one rank and no accumulation (the update is then
# in the backward pass's graph): bytes per element of the tied embedding (V x D), its
# gradients, and per logit (N x V), the logits' buffers:
EMBED_LEFT, LOGITS_LEFT = 3.0, 11.1


@dataclass(frozen=True)
class Terms:
    """The weights of the terms above on one backend, for one compute dtype."""

    g: float = G
    bf16: float = BF16
    accumulate: float = ACCUMULATE
    u: float = U
    u_bf16: float = U_BF16
    r: float = R
    r_bf16: float = R_BF16
    a_d: float = A_D
    a_f: float = A_F
    a_s: float = A_S
    checkpoint: float = CHECKPOINT
    recomputed: float = RECOMPUTED
    x_d: float = X_D
    x_f: float = X_F
    x_s: float = X_S
    logits: float = LOGITS
    logits_bf16: float = LOGITS_BF16
    embed_left: float = EMBED_LEFT
    logits_left: float = LOGITS_LEFT
    # Terms a CPU does not need (0 there; the module's docstring, Backends):
    x_hd: float = 0.0          # D-wide arrays of the pass weighing head_dim / 64 each
    g_checkpoint: float = 0.0  # with grad_checkpoint: gradients made when its pass peaks
    u_layer: float = 0.0       # the update, a parameter, each layer of the model


#: The backends the plan has terms for. ``metal`` (a job's hosts are Macs) and ``cpu`` share
#: the terms above, fitted to CPU runs (no Mac here to measure); ``cuda`` has its own.
BACKENDS = ("metal", "cpu", "cuda")
#: The backend a plan is for unless told: mlxops' nodes are Macs.
DEFAULT_BACKEND = "metal"
CPU_TERMS = Terms()
#: Per backend and compute dtype (``train.dtype``); see :func:`terms`.
TERMS: dict[tuple[str, str], Terms] = {
    (b, dtype): CPU_TERMS for b in ("metal", "cpu") for dtype in ("float32", "bfloat16")}
# MLX's CUDA build (an NVIDIA H200, MLX 0.32.4; the step as it runs there: gradients launched
# first, the bfloat16 working copy), fitted by benchmarks/gpu_fit.py to 68 runs: issue 33's
# table (its four rows, 50 steps) held within 0.90-1.15 of its peaks, every other run never
# below 0.90, the largest excess over 1.15 made as small as that allows (float32: 1.32, a
# 6-step run with checkpointing; bfloat16: 1.20); none hold every run within 1.15 (peaks
# grow over a run's first steps on CUDA, unmodelled). Why they differ from a CPU's (cuDNN's
# bfloat16 attention keeps no H x T probabilities: a_s = x_s = 0; checkpointing saves far
# less), what they hold out of sample: docs/trainer.md, benchmarks/README.md.
TERMS[("cuda", "float32")] = Terms(
    g=0.0, bf16=0.0, accumulate=0.98, u=16.69, u_bf16=0.0, u_layer=0.0, a_d=17.29, a_f=0.0,
    a_s=1.03, checkpoint=0.0, g_checkpoint=0.0, x_d=182.43, x_f=0.0, x_s=0.0, x_hd=0.0,
    logits=0.0, logits_bf16=0.0)
TERMS[("cuda", "bfloat16")] = Terms(
    g=0.0, bf16=0.0, accumulate=0.3, u=24.86, u_bf16=0.0, u_layer=0.55, a_d=47.44, a_f=0.0,
    a_s=0.0, checkpoint=21.93, g_checkpoint=21.62, x_d=96.87, x_f=0.0, x_s=0.0, x_hd=17.09,
    logits=16.69, logits_bf16=0.0)


@dataclass(frozen=True)
class Sharded:
    """ZeRO-1's state per rank, in bytes (the module's docstring): what sharding saves."""

    weights: int        # the model's weights: float32 (4 P), or bfloat16 (2 P)
    master: int         # bfloat16 runs: this rank's float32 master slice (4 P / n)
    optimizer: int      # this rank's slice of AdamW's moments (8 P / n)
    gathered: int       # the weights the all_gather brings every step (w P)
    unsharded: int      # the state without sharding (12 P)

    @property
    def state(self) -> int:
        return self.weights + self.master + self.optimizer

    @property
    def saved(self) -> int:
        return self.unsharded - self.state


def sharded_terms(cfg: TrainerConfig, world: int) -> Sharded:
    """ZeRO-1's state over ``world`` ranks (one rank: nothing sharded, nothing saved but
    the bfloat16 weights)."""
    p, n = count_params(cfg), max(1, world)
    bf16 = cfg.train.dtype == "bfloat16"
    w = 2 if bf16 else 4
    return Sharded(weights=w * p, master=(4 * p + n - 1) // n if bf16 else 0,
                   optimizer=(8 * p + n - 1) // n, gathered=w * p, unsharded=STATE * p)


@dataclass
class Peak:
    """One rank's estimated peak in bytes: the larger of its two moments."""

    state: int      # weights and AdamW's moments
    compute: int    # the top of a micro-batch's forward/backward pass (state included)
    update: int     # the optimizer step (state included)

    @property
    def total(self) -> int:
        return max(self.compute, self.update)


@dataclass
class MemoryPlan(PlanFields):
    """One rank's plan: the fields every plan has (:class:`~.plansearch.PlanFields`) and
    the trainer's own."""

    param_bytes: int       # per rank: float32 weights (and their bfloat16 copy)
    sharded: bool = False  # AdamW's state sharded over the ranks (ZeRO-1)


def count_params(cfg: TrainerConfig) -> int:
    m = cfg.model
    d, f, v = m.dims, m.hidden(), m.vocab_size
    per_layer = 4 * d * d + 3 * d * f + 2 * d
    head = 0 if m.tie_embeddings else v * d
    return v * d + m.layers * per_layer + d + head


def weight_arrays(cfg: TrainerConfig) -> int:
    """How many arrays the model's weights are: 7 per layer, the embedding, the final norm
    (and the untied head)."""
    return 7 * cfg.model.layers + 2 + (0 if cfg.model.tie_embeddings else 1)


def terms(backend: str, dtype: str) -> Terms:
    """The terms' weights for ``backend`` (one of :data:`BACKENDS`) and a compute dtype."""
    try:
        return TERMS[(backend, dtype)]
    except KeyError:
        raise ValueError(f"no memory plan terms for backend {backend!r} and dtype {dtype!r} "
                         f"(backends: {', '.join(BACKENDS)})") from None


def estimate(cfg: TrainerConfig, micro: int, accumulation: int = 1, world: int = 1,
             grad_checkpoint: bool | None = None, shard: bool = False,
             backend: str = DEFAULT_BACKEND) -> Peak:
    """One rank's peak with ``micro`` sequences per forward/backward, ``accumulation`` of
    them per step, over ``world`` ranks (``grad_checkpoint``: the config's by default;
    ``shard``: AdamW's state sharded over the ranks, ZeRO-1), on ``backend`` (the trainer
    passes the one it runs on; the controller plans for Macs)."""
    m, t = cfg.model, cfg.train
    k = terms(backend, t.dtype)
    ckpt = t.grad_checkpoint if grad_checkpoint is None else grad_checkpoint
    p, d, f, v = count_params(cfg), m.dims, m.hidden(), m.vocab_size
    n, ht = micro * m.seq_len, m.heads * m.seq_len
    hd = d // m.heads
    bf16, accumulating = t.dtype == "bfloat16", accumulation > 1
    w = 2 if bf16 else 4
    vd = v * d if m.tie_embeddings else 0
    layer = w * n * (k.a_d * d + k.a_f * f + k.a_s * ht)
    if ckpt:  # each layer's input; one layer recomputed (two, at times, side by side)
        layers = ((1 + k.recomputed * (m.layers > 1)) * layer
                  + m.layers * w * n * d * k.checkpoint)
    else:
        layers = m.layers * layer
    compute = ((k.g + k.bf16 * bf16 + k.accumulate * accumulating
                + k.g_checkpoint * ckpt) * p + layers
               + w * n * (k.x_d * d + k.x_f * f + k.x_s * ht + k.x_hd * d * hd / 64)
               + (k.logits + k.logits_bf16 * bf16) * n * v)
    update = (k.u + k.u_bf16 * bf16 + k.u_layer * m.layers) * p
    if world > 1:
        side_by_side = min(1.0, MLX_BFS_WIDTH / weight_arrays(cfg)) ** 2
        update += (k.r_bf16 if t.grad_reduce_dtype == "bfloat16" else k.r) * side_by_side * p
    elif not accumulating:  # the update is in the backward pass's graph
        update += k.embed_left * vd + k.logits_left * n * v
    if 0 < m.window < m.seq_len:
        compute += m.seq_len ** 2   # the window's mask, bool
    state = STATE * p
    if shard:
        z = sharded_terms(cfg, world)
        # New moments for the slice only; besides, arrays of the slice's size (4 P / n
        # each): its new float32 weights before the all_gather, its gradients and (float32:
        # cut from the model's weights) its weights copied out for the optimizer, and the
        # optimizer's intermediates (SLICE_ARRAYS, fitted: benchmarks/zero.py).
        per_slice = (4 * p + world - 1) // max(1, world)
        update -= (8 * p - z.optimizer) - per_slice * (SLICE_ARRAYS - bf16)
        if bf16:  # no bfloat16 copy of the weights: half of BF16's term; the gathered
            compute -= k.bf16 / 2 * p            # weights are bfloat16, not float32
            update -= 2 * p
        state = z.state
    return Peak(state, int(state + compute), int(state + update))


def attended_keys(seq_len: int, window: int = 0) -> float:
    """The keys a query attends to, on average over a sequence: ``(T + 1) / 2`` causal,
    ``mean_i min(i + 1, W)`` with a window of ``W`` tokens."""
    w = window if 0 < window < seq_len else seq_len
    # Queries 0..w-1 see i + 1 keys, the T - w after them w each.
    return (w * (w + 1) / 2 + (seq_len - w) * w) / seq_len


def attention_flops_per_token(cfg: TrainerConfig) -> float:
    """Forward and backward FLOPs of attention's scores and weighted sum, per token:
    ``12 L D K`` (``q.k`` and ``p.v``, 2 D each per key, 3x for the backward pass), with K
    the keys attended (:func:`attended_keys`); not in ``6 x params x tokens``."""
    m = cfg.model
    return 12 * m.layers * m.dims * attended_keys(m.seq_len, m.window)


def budget_bytes(memory_bytes: int, working_set: int | None, ranks_per_node: int = 1
                 ) -> tuple[int, str]:
    """What one of ``ranks_per_node`` ranks may use, and where that comes from: the GPU's
    recommended working set where MLX reports one (a Mac), else :data:`CPU_FRACTION` of
    ``memory_bytes``; shared equally by the node's ranks."""
    if working_set:
        return working_set // max(1, ranks_per_node), "working set"
    return int(memory_bytes * CPU_FRACTION) // max(1, ranks_per_node), "memory"


def plan_memory(
    config: TrainerConfig | dict[str, Any],
    memory_bytes: int,
    world_size: int,
    ranks_per_node: int = 1,
    per_rank: int | None = None,
    working_set: int | None = None,
    shard: bool = False,
) -> MemoryPlan:
    """Plan one rank on a node with ``memory_bytes`` of memory shared by ``ranks_per_node``
    (and, on a Mac, MLX's recommended ``working_set``: the budget, see :func:`budget_bytes`).

    ``per_rank``: the rank's sequences per step when ``train.balance`` gives it its own
    share (trainer/balance.py); by default ``global_batch / world_size``.

    The suggested micro-batch is the largest divisor of the per-rank batch, not above
    ``train.micro_batch``, that fits, first without gradient checkpointing (unless the
    config asks for it), then with it; ``fits`` is False if even micro-batch 1 with
    checkpointing does not (the shared search, :mod:`.plansearch`).
    """
    cfg = config if isinstance(config, TrainerConfig) else load_config(config)
    t = cfg.train
    n = count_params(cfg)
    budget, source = budget_bytes(memory_bytes, working_set, ranks_per_node)
    per_rank = per_rank or max(1, t.global_batch // world_size)
    bf16 = t.dtype == "bfloat16"
    choice = search(trainer_micro_batches(per_rank, t.micro_batch), t.grad_checkpoint,
                    lambda micro, ckpt: estimate(cfg, micro, per_rank // micro, world_size,
                                                 ckpt, shard).total, budget)
    micro, ckpt = choice.micro_batch, choice.grad_checkpoint
    accumulation = per_rank // micro
    peak = estimate(cfg, micro, accumulation, world_size, ckpt, shard)
    z = sharded_terms(cfg, world_size) if shard else None
    return MemoryPlan(
        params=n, param_bytes=(z.weights + z.master) if z else n * (6 if bf16 else 4),
        grad_bytes=4 * n * (2 if accumulation > 1 else 1),
        optimizer_bytes=z.optimizer if z else 8 * n,
        activation_bytes=peak.compute - peak.state, update_bytes=peak.update - peak.state,
        total_bytes=peak.total, budget_bytes=budget, budget_from=source, micro_batch=micro,
        accumulation=accumulation, grad_checkpoint=ckpt, fits=choice.fits,
        world_size=world_size, sharded=shard)
