"""A Triton kernel launched through its compiled kernel's runner: the JIT's per-call binding skipped.

A launch through Triton's JIT binds and specializes every argument on every call, on the engine's
thread: on the H200 machine the hot-row cache's classify kernel (14 arguments) took 50 us of host
time a call that way and its three serve-side kernels 77 us, where their GPU time was 2-5 us each
(docs/history/benchmarks-2026-12.md, "Where a cached lookup's time goes").  The compiled kernel's runner takes the
arguments as they are.

A compiled kernel is valid only for arguments like those it was compiled for: Triton specializes
an integer on its width (32 or 64 bits), on being divisible by 16 and on being 1, and a tensor on
its dtype and on its address being 16-byte aligned.  So a launch is compiled from sample arguments
(``sample``: the real tensors, and integers chosen to assume as little as possible), and every call
checks its arguments against what the compilation assumed; a call that differs takes the JIT's
launch, which is always right.  Whether the runner takes the constexpr arguments too differs
between Triton versions: ``runner_takes_constants`` learns it once per process with a probe kernel,
and where neither form works (a Triton without this runner) every call takes the JIT's launch.
"""
from __future__ import annotations

import logging

import torch
import triton
import triton.language as tl

log = logging.getLogger("engram_client")
_I32 = (-(1 << 31), 1 << 31)
_convention: dict[int, bool | None] = {}  # device index -> runner_takes_constants's answer


def _spec(value):
    """What Triton specializes of one argument, as a key; None: nothing (floats)."""
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, value.data_ptr() % 16 == 0)
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return ("int", _I32[0] <= value < _I32[1], value % 16 == 0, value == 1)


def _fits(assumed, value) -> bool:
    """A call's argument ``value`` satisfies what the compilation ``assumed`` of it."""
    if assumed is None:
        return True
    now = _spec(value)
    if now is None or now[0] != assumed[0]:
        return False
    if assumed[0] == "tensor":
        return now[1] is assumed[1] and (now[2] or not assumed[2])
    return now[1] == assumed[1] and (now[2] or not assumed[2]) and (now[3] or not assumed[3])


@triton.jit
def _probe_kernel(out_ptr, value, ADD: tl.constexpr):
    tl.store(out_ptr, value + ADD)


def runner_takes_constants(device: torch.device) -> bool | None:
    """True/False: the compiled runner wants the constexpr arguments too / not; None: no runner here."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index in _convention:
        return _convention[index]
    answer = None
    stream = torch.cuda.Stream(device)
    with torch.cuda.device(device), torch.cuda.stream(stream):
        out = torch.zeros(1, dtype=torch.int32, device=device)
        try:
            compiled = _probe_kernel.warmup(out, 5, grid=(1,), ADD=3)
            compiled._init_handles()
            for with_constants in (True, False):
                out.zero_()
                constants = (3,) if with_constants else ()
                try:
                    compiled.run(1, 1, 1, stream.cuda_stream, compiled.function, compiled.packed_metadata, None,
                                 None, None, out, 37, *constants)
                except Exception as exc:  # the other form, or no runner at all
                    log.debug("Triton's compiled runner refused the %s form: %s",
                              "with constants" if with_constants else "without constants", exc)
                    continue
                stream.synchronize()
                if int(out.item()) == 40:
                    answer = with_constants
                    break
        except Exception as exc:  # a Triton without warmup or this runner: the JIT's launch serves
            log.debug("Triton's compiled runner is not usable: %s", exc)
        stream.synchronize()
    _convention[index] = answer
    return answer


class CompiledLaunch:
    """``launch(grid, stream, raw_stream, *args)``: enqueue ``kernel`` on ``stream`` (``raw_stream``
    its CUstream), through the runner when the arguments fit the compilation, else the JIT."""

    def __init__(self, kernel, sample: tuple, constants: dict, device: torch.device):
        self.kernel, self.constants = kernel, constants
        self._assumed = tuple(_spec(value) for value in sample)
        self._run = None
        if any(assumed is not None and assumed[0] == "int" and assumed[3] for assumed in self._assumed):
            return  # Triton makes an integer of 1 a constant: such a compilation is the JIT's to run
        takes_constants = runner_takes_constants(device)
        if takes_constants is None:
            return
        with torch.cuda.device(device):
            compiled = kernel.warmup(*sample, grid=(1,), **constants)
            compiled._init_handles()
        run, function, packed = compiled.run, compiled.function, compiled.packed_metadata
        extra = tuple(constants.values()) if takes_constants else ()
        # Launch hooks (profilers) get their metadata; without any, skip building it per call.
        hooked = getattr(getattr(getattr(triton, "knobs", None), "runtime", None), "launch_enter_hook", None)
        metadata = compiled.launch_metadata if hooked is not None else None

        def runner(grid: int, raw_stream: int, args: tuple) -> None:
            meta = metadata((grid, 1, 1), raw_stream, *args) if metadata else None
            run(grid, 1, 1, raw_stream, function, packed, meta, None, None, *args, *extra)
        self._run = runner

    @property
    def fast(self) -> bool:
        return self._run is not None

    def fits(self, args: tuple) -> bool:
        return len(args) == len(self._assumed) and all(map(_fits, self._assumed, args))

    def __call__(self, grid: int, stream: torch.cuda.Stream, raw_stream: int, *args) -> None:
        if self._run is not None and self.fits(args):
            self._run(grid, raw_stream, tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args))
            return
        with torch.cuda.stream(stream):
            self.kernel[(grid,)](*args, **self.constants)

    def unchecked(self, grid: int, raw_stream: int, *args) -> None:
        """The runner without the per-call check (only where ``fast``), for callers whose every
        argument is one the compilation assumed: their own buffers, integers that stay generic.
        Pointers are best passed as integers (``data_ptr()``): for a tensor the runner calls its
        data_ptr and asks the driver about the address (cuPointerGetAttribute), a few
        microseconds a pointer on the H200 machine; an integer it takes as it is."""
        self._run(grid, raw_stream, args)
