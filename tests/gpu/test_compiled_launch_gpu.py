"""Kernels launched through Triton's compiled runner (compiled_launch.py), on CUDA: a call whose
arguments differ from what the compilation assumed (a misaligned tensor, another dtype, a
64-bit integer, an integer not divisible by 16 where the sample was) takes the JIT's launch, and
every call, either way, gives the JIT's own result."""
from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")  # the suite's CPU machines have no Triton
tl = triton.language
from engram_client.lookup.compiled_launch import CompiledLaunch, runner_takes_constants  # noqa: E402

pytestmark = pytest.mark.gpu
BLOCK = 128


@triton.jit
def _add_kernel(x_ptr, out_ptr, n, k, BLOCK_: tl.constexpr):
    offs = tl.program_id(0) * BLOCK_ + tl.arange(0, BLOCK_)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + k, mask=mask)


def _grid(n: int) -> int:
    return triton.cdiv(n, BLOCK)


def test_this_triton_has_a_runner_and_it_is_used_for_matching_arguments():
    assert runner_takes_constants(torch.device("cuda:0")) is not None
    x = torch.arange(413, dtype=torch.int64, device="cuda")
    launch = CompiledLaunch(_add_kernel, (x, torch.empty_like(x), 413, 7), {"BLOCK_": BLOCK}, torch.device("cuda:0"))
    assert launch.fast
    big = torch.arange(6144, dtype=torch.int64, device="cuda")
    assert launch.fits((big, torch.empty_like(big), 6144, 5))  # a generic compilation takes any n and k


def test_calls_unlike_the_sample_take_the_jit_and_every_result_is_right():
    device, stream = torch.device("cuda:0"), torch.cuda.current_stream()
    x = torch.arange(413, dtype=torch.int64, device="cuda")
    launch = CompiledLaunch(_add_kernel, (x, torch.empty_like(x), 413, 7), {"BLOCK_": BLOCK}, device)
    base = torch.arange(10_000, dtype=torch.int64, device="cuda")
    cases = {
        "like the sample": (base[:6144], 5, True),
        "misaligned tensor": (base[1:6145], 5, False),
        "int32 tensor": (base[:6144].to(torch.int32), 5, False),
        "64-bit integer": (base[:6144], 1 << 40, False),
    }
    for name, (ids, k, fits) in cases.items():
        out = torch.full_like(ids, -1)
        assert launch.fits((ids, out, ids.numel(), k)) is fits, name
        launch(_grid(ids.numel()), stream, stream.cuda_stream, ids, out, ids.numel(), k)
        torch.cuda.synchronize()
        assert torch.equal(out, ids + k), name
    divisible = CompiledLaunch(_add_kernel, (base[:416], torch.empty_like(base[:416]), 416, 7), {"BLOCK_": BLOCK},
                               device)
    out = torch.full_like(base[:413], -1)
    assert not divisible.fits((base[:413], out, 413, 7))  # compiled assuming n % 16 == 0
    divisible(_grid(413), stream, stream.cuda_stream, base[:413], out, 413, 7)
    torch.cuda.synchronize()
    assert torch.equal(out, base[:413] + 7)


def test_a_sample_integer_of_one_keeps_the_jit():
    x = torch.arange(413, dtype=torch.int64, device="cuda")
    launch = CompiledLaunch(_add_kernel, (x, torch.empty_like(x), 413, 1), {"BLOCK_": BLOCK}, torch.device("cuda:0"))
    assert not launch.fast  # Triton makes an integer of 1 a constant of the compilation
    out = torch.full_like(x, -1)
    stream = torch.cuda.current_stream()
    launch(_grid(413), stream, stream.cuda_stream, x, out, 413, 1)
    torch.cuda.synchronize()
    assert torch.equal(out, x + 1)
