"""Is this exception MLX running out of memory? One rule for every form MLX raises.

The out-of-memory back-off (:mod:`.loop`) redoes a step with smaller micro-batches when,
and only when, the step failed for want of memory; any other error must propagate. MLX
says "out of memory" in these forms (MLX 0.32, ml-explore/mlx at tag v0.32.0):

- **Metal's allocator**, when ``newBuffer`` returns nothing
  (mlx/backend/metal/allocator.cpp): ``[malloc] Unable to allocate N bytes.``
- **Metal's command buffer**, when the GPU could not make the buffers a command buffer
  uses resident (mlx/backend/metal/device.cpp, ``CommandEncoder::commit``):
  ``[METAL] Command buffer execution failed: {localizedDescription}.``, where macOS's
  description is ``Insufficient Memory (00000008:kIOGPUCommandBufferCallbackErrorOutOfMemory)``.
  The description's words are localized; its tag in parentheses is not, so the tag is
  what is matched. This is the form a Mac gives when a training step outgrows memory.
- **CUDA's allocator** (mlx/backend/cuda/allocator.cpp): ``[malloc] Unable to allocate N
  bytes.`` for unified memory, and ``cudaMalloc(&data, size) failed: out of memory`` /
  ``cudaMallocAsync(&data, size, stream) failed: out of memory`` /
  ``cudaMallocManaged(&data, size) failed: out of memory`` from ``CHECK_CUDA_ERROR``
  (mlx/backend/cuda/utils.cpp: ``"{} failed: {}"`` with ``cudaGetErrorString``, which
  says ``out of memory`` for ``cudaErrorMemoryAllocation``; ``cuGetErrorString`` says
  the same for ``CUDA_ERROR_OUT_OF_MEMORY``).
- Python's own :class:`MemoryError`.

Not memory, so not backed off: ``[metal::malloc] Resource limit (N) exceeded.`` (too
many buffers, which smaller micro-batches do not reduce), and any other message holding
"alloc" (the rule before this module matched that substring and would have redone a
step on, e.g., an allocator's bad argument).

**Before MLX 0.32 a Metal out-of-memory aborts the process.** MLX 0.31 and older raised
the command buffer's error from its completion handler, on a Metal thread
(mlx/backend/metal/eval.cpp, ``check_error`` at v0.31.2): an uncaught C++ exception
there terminates the process (``libc++abi: terminating due to uncaught exception``), so
no Python code sees it. MLX 0.32 (commit a025496c8, "Catch error in CommandBuffer and
poison the events", ml-explore/mlx#3523) keeps the error and raises it from the next wait
on the calling thread. :func:`backoff_unavailable` says so for the running MLX.

Standard library only (a pure rule; the controller's docs tests import it).
"""

from __future__ import annotations

#: The form a Mac raises (MLX 0.32, mlx/backend/metal/device.cpp with macOS's
#: description); the test hook ``MLXOPS_TRAINER_FAKE_OOM`` raises this one.
COMMAND_BUFFER_OOM = ("[METAL] Command buffer execution failed: Insufficient Memory "
                      "(00000008:kIOGPUCommandBufferCallbackErrorOutOfMemory).")

#: Lower-cased substrings, any of which marks an out-of-memory error (module docstring).
MARKERS = (
    "[malloc] unable to allocate",             # metal/allocator.cpp, cuda/allocator.cpp
    "callbackerroroutofmemory",                # metal/device.cpp + macOS's tag
    "failed: out of memory",                   # cuda/utils.cpp check_cuda_error
    "cudaerrormemoryallocation",               # the enum's name, where a message spells it
    "cuda_error_out_of_memory",                # the driver API's, likewise
)

#: The first MLX whose Metal command-buffer errors reach Python (module docstring).
FIRST_CATCHABLE = (0, 32)


def is_oom(error: BaseException) -> bool:
    """True when ``error`` is MLX (or Python) running out of memory."""
    if isinstance(error, MemoryError):
        return True
    text = str(error).lower()
    return any(marker in text for marker in MARKERS)


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:3]:
        digits = "".join(c for c in piece if c.isdigit()) if piece[:1].isdigit() else ""
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def backoff_unavailable(mlx_version: str, metal: bool) -> str | None:
    """Why the out-of-memory back-off cannot engage with this MLX, or None when it can.

    ``metal``: the GPU is Apple's (``mx.metal.is_available()``). On Metal before
    :data:`FIRST_CATCHABLE` a command buffer's out-of-memory aborts the process."""
    if metal and _version(mlx_version) < FIRST_CATCHABLE:
        return (f"MLX {mlx_version} aborts the process when a Metal command buffer runs out "
                "of memory (raised on a Metal thread before MLX 0.32): the out-of-memory "
                "back-off cannot engage; upgrade MLX to 0.32 or later")
    return None
