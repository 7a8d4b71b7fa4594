"""What a space's ``backend`` means to the rest of EvoEngineer, in one object (no ``backend == "cuda"`` branches
elsewhere): where the kernels run, what compiles them, what a space must name, and whether compiles may run while a
kernel is timed."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Backend:
    name: str
    #: torch device type the kernels run on
    device: str
    #: a candidate's source file suffix (nvcc for .cu, the C++ compiler for .cpp)
    source_suffix: str
    #: the kernels run and are timed on a GPU (the GPU-busy share, a device that must be present)
    gpu: bool
    #: nvcc compiles the kernels: device flags ([build] cuda_flags), a ptxas report for the static gate, an arch the
    #: space names, compute-sanitizer for the elites, device-only builds
    device_compiler: bool
    #: compiles may run while a kernel is timed (not for CPU kernels: they are timed on the cores compilers take)
    builds_beside_measuring: bool

    @property
    def needs_arch(self) -> bool:
        return self.device_compiler


CUDA = Backend("cuda", device="cuda", source_suffix=".cu", gpu=True, device_compiler=True,
               builds_beside_measuring=True)
CPU = Backend("cpu", device="cpu", source_suffix=".cpp", gpu=False, device_compiler=False,
              builds_beside_measuring=False)
BACKENDS = {b.name: b for b in (CPU, CUDA)}


def backend_of(name: str) -> Backend:
    """The backend called `name` (KeyError naming the known ones)."""
    try:
        return BACKENDS[name]
    except KeyError:
        raise KeyError(f"backend {name!r}: one of {', '.join(BACKENDS)}") from None
