"""Registering mapped table memory with CUDA and viewing it from the GPU (UVA).

cudaHostRegister pins the pages and maps them into the device's address space; the
GPU then reads rows over PCIe with no copy.  Facts this code relies on:
- one registration of 512 GiB or more fails on current drivers, so ranges are
  registered in chunks of at most 64 GiB;
- a PROT_READ mapping registers only with cudaHostRegisterReadOnly (flag 0 fails
  with invalid-value), where cudaDevAttrHostRegisterReadOnlySupported says so;
- a failed registration leaves its error pending, and the next kernel launch then
  reports it far from the cause, so every failure path clears it.
There is no fallback to a private copy: if registration fails, attach fails.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..core.errors import CudaRegistrationError

MAX_CHUNK = 64 * 2**30
REGISTER_PORTABLE, REGISTER_MAPPED, REGISTER_READ_ONLY = 0x1, 0x2, 0x8


def _runtime():
    try:
        from cuda.bindings import runtime
    except ImportError:
        try:
            from cuda import cudart as runtime  # cuda-python < 12.6 spelling
        except ImportError as exc:
            raise CudaRegistrationError("device is CUDA but cuda-bindings is not installed "
                                        "(pip install 'engramd[gpu]')") from exc
    return runtime


def _check(result, what: str):
    runtime = _runtime()
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != runtime.cudaError_t.cudaSuccess:
        runtime.cudaGetLastError()  # clear the pending error so it does not surface at the next launch
        name = runtime.cudaGetErrorName(err)[1].decode() if hasattr(runtime, "cudaGetErrorName") else str(err)
        raise CudaRegistrationError(f"{what} failed: {name}")
    return values[0] if len(values) == 1 else values


class _DeviceBytes:
    """Just enough of __cuda_array_interface__ for torch to wrap a device pointer."""

    def __init__(self, pointer: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (pointer, False),
                                         "version": 3, "strides": None}


@dataclass
class HostRegistration:
    """One registered host range, possibly several driver registrations; viewable on one device."""
    address: int
    nbytes: int
    device: torch.device
    read_only: bool = True
    chunks: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        runtime = _runtime()
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        torch.cuda.init()
        with torch.cuda.device(index):
            supported = _check(runtime.cudaDeviceGetAttribute(
                runtime.cudaDeviceAttr.cudaDevAttrHostRegisterReadOnlySupported, index),
                "cudaDeviceGetAttribute(HostRegisterReadOnlySupported)")
            if self.read_only and not supported:
                raise CudaRegistrationError(f"cuda:{index} cannot register read-only host memory, and the table is "
                                            "mapped read-only so no rank can corrupt it")
            flags = REGISTER_PORTABLE | REGISTER_MAPPED | (REGISTER_READ_ONLY if self.read_only else 0)
            try:
                for start in range(0, self.nbytes, MAX_CHUNK):
                    size = min(MAX_CHUNK, self.nbytes - start)
                    _check(runtime.cudaHostRegister(self.address + start, size, flags),
                           f"cudaHostRegister({size} bytes at +{start}, flags {flags:#x}) on cuda:{index}")
                    self.chunks.append(self.address + start)
                self.device_pointer = self._device_pointer(runtime)
            except BaseException:
                self.unregister()
                raise
        self.device = torch.device("cuda", index)

    def _device_pointer(self, runtime) -> int:
        pointers = [int(_check(runtime.cudaHostGetDevicePointer(chunk, 0), "cudaHostGetDevicePointer"))
                    for chunk in self.chunks]
        base = pointers[0]
        for chunk, pointer in zip(self.chunks, pointers):
            if pointer - base != chunk - self.address:
                raise CudaRegistrationError("the device maps the registered chunks at non-contiguous addresses; "
                                            "this device cannot view a table larger than 64 GiB as one range")
        return base

    def tensor(self) -> torch.Tensor:
        """A uint8 CUDA tensor over the registered range (reads go over PCIe)."""
        return torch.as_tensor(_DeviceBytes(self.device_pointer, self.nbytes), device=self.device)

    def unregister(self) -> None:
        runtime = _runtime()
        while self.chunks:
            chunk = self.chunks.pop()
            err = runtime.cudaHostUnregister(chunk)
            err = err[0] if isinstance(err, tuple) else err
            if err != runtime.cudaError_t.cudaSuccess:
                runtime.cudaGetLastError()  # at interpreter exit the context may already be gone
