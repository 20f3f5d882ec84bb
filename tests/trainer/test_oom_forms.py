"""The out-of-memory rule (mlxops/trainer/oom.py) over the messages MLX itself raises.

Each string is MLX's, built as its source builds it; the file and the tag it comes from
are named beside it (ml-explore/mlx; tag v0.32.0 unless said). The command buffer's
description is macOS's, as MLX printed it on a Mac (quoted in issue 30, and in users'
reports of the abort: ``std::runtime_error: [METAL] Command buffer execution failed:
Insufficient Memory (00000008:kIOGPUCommandBufferCallbackErrorOutOfMemory)``).
"""

from __future__ import annotations

import pytest

from mlxops.trainer import oom

OUT_OF_MEMORY = [
    # mlx/backend/metal/allocator.cpp, MetalAllocator::malloc: newBuffer returned nothing
    ("metal/allocator.cpp v0.32.0", "[malloc] Unable to allocate 17179869184 bytes."),
    # mlx/backend/metal/device.cpp, CommandEncoder::commit's completed handler:
    # fmt::format("[METAL] Command buffer execution failed: {}.", localizedDescription)
    ("metal/device.cpp v0.32.0", "[METAL] Command buffer execution failed: Insufficient "
     "Memory (00000008:kIOGPUCommandBufferCallbackErrorOutOfMemory)."),
    # the same with macOS's description in another language: the tag is not translated
    ("metal/device.cpp v0.32.0, localized", "[METAL] Command buffer execution failed: "
     "Mémoire insuffisante (00000008:kIOGPUCommandBufferCallbackErrorOutOfMemory)."),
    # mlx/backend/cuda/allocator.cpp, CudaAllocator::malloc, unified memory (device -1)
    ("cuda/allocator.cpp v0.32.0", "[malloc] Unable to allocate 1073741824 bytes."),
    # mlx/backend/cuda/allocator.cpp CHECK_CUDA_ERROR(cudaMalloc(&data, size)) through
    # mlx/backend/cuda/utils.cpp check_cuda_error: "{} failed: {}" with cudaGetErrorString
    # (cudaErrorMemoryAllocation reads "out of memory")
    ("cuda/allocator.cpp + cuda/utils.cpp v0.32.0",
     "cudaMalloc(&data, size) failed: out of memory"),
    ("cuda/allocator.cpp + cuda/utils.cpp v0.32.0",
     "cudaMallocAsync(&data, size, stream) failed: out of memory"),
    ("cuda/allocator.cpp + cuda/utils.cpp v0.32.0",
     "cudaMallocManaged(&data, size) failed: out of memory"),
]

NOT_OUT_OF_MEMORY = [
    # mlx/backend/metal/allocator.cpp: too many buffers, not too many bytes
    ("metal/allocator.cpp v0.32.0", "[metal::malloc] Resource limit (499000) exceeded."),
    # mlx/backend/metal/device.cpp: a command buffer that failed for another reason
    ("metal/device.cpp v0.32.0", "[METAL] Command buffer execution failed: Caused GPU "
     "Timeout Error (00000002:kIOGPUCommandBufferCallbackErrorTimeout)."),
    # mlx/backend/metal/event.cpp: unrelated, though it says "Failed to create"
    ("metal/event.cpp v0.32.0", "[Event::Event] Failed to create Metal shared event."),
    # a bad argument to an allocator-named function: the old rule matched "alloc"
    ("mlx/allocator.cpp-like", "[reallocate] invalid size"),
    ("cuda/utils.cpp v0.32.0", "cudaMemcpy(dst, src, n, kind) failed: invalid argument"),
]


@pytest.mark.parametrize(("source", "message"), OUT_OF_MEMORY)
def test_every_form_mlx_raises_for_out_of_memory_is_recognised(source, message):
    assert oom.is_oom(RuntimeError(message)), source


@pytest.mark.parametrize(("source", "message"), NOT_OUT_OF_MEMORY)
def test_other_errors_are_not_taken_for_out_of_memory(source, message):
    assert not oom.is_oom(RuntimeError(message)), source


def test_python_memory_error_is_out_of_memory():
    assert oom.is_oom(MemoryError())


def test_the_test_hook_raises_the_command_buffer_form():
    assert oom.COMMAND_BUFFER_OOM == OUT_OF_MEMORY[1][1]
    assert oom.is_oom(RuntimeError(oom.COMMAND_BUFFER_OOM))


@pytest.mark.parametrize(("version", "metal", "available"), [
    ("0.31.2", True, False), ("0.29.0", True, False), ("0.32.0", True, True),
    ("0.32.4", True, True), ("1.0.0.dev20270101", True, True), ("0.31.2", False, True),
])
def test_the_back_off_is_unavailable_on_metal_before_mlx_0_32(version, metal, available):
    reason = oom.backoff_unavailable(version, metal)
    assert (reason is None) == available
    if reason:
        assert version in reason and "0.32" in reason


def test_the_hook_raises_the_command_buffer_form_through_the_loop(tmp_path):
    """A rank at micro_batch 1 cannot back off: the run stops with one line quoting what
    the hook raised, the command buffer's form (a run that can back off, and finishes, is
    tests/trainer/test_multiprocess.py's and tests/finetune/test_resume.py's)."""
    from trainer_procs import run_trainer, write_config

    config = write_config(tmp_path, tmp_path / "out",
                          train={"steps": 4, "global_batch": 1, "micro_batch": 1})
    proc = run_trainer(config, env={"MLXOPS_TRAINER_FAKE_OOM": "2"})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.strip() == (f"error: out of memory at step 2 with micro_batch 1: "
                                   f"{oom.COMMAND_BUFFER_OOM} (test hook)")
