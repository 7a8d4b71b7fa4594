"""The physics gate: a time faster than the device allows for the work a family declares is `implausible`.

A family may declare per shape `min_bytes` (each input read once, each output written once) and `flops`. A measured
time t is implausible when

    min_bytes / t > MARGIN x peak bandwidth     or     flops / t > MARGIN x peak arithmetic rate.

Peaks, CUDA: from the device (driver attributes: memory clock x bus width x 2 for DRAM; SMs x SM clock x the
architecture's densest tensor rate per SM and clock, FP8/INT8 or FP4 where the chip has it), with a per-name table
where the driver does not report the clocks. When L2 is not flushed between calls, warm L2 may serve up to its size
of the declared bytes at L2's bandwidth (taken as `L2_OVER_DRAM` x DRAM's: no device reports it; H100's L2 measures
~2-3x its HBM) and DRAM the rest. CPU: a copy of the same number of bytes (torch, every core, warm caches) measured
when the worker starts; the arithmetic bound is not used on the CPU.

Margins (stated, generous on purpose: the gate catches times no kernel can reach, not slow baselines):
GPU 1.10 (boost clocks above the reported ones, rounding of the declared counts), CPU 3.0 (a kernel may copy faster
than torch's copy, e.g. with streaming stores).
"""

from __future__ import annotations

import ctypes
import statistics
from dataclasses import dataclass
from typing import Any

GPU_MARGIN = 1.10
CPU_MARGIN = 3.0
L2_OVER_DRAM = 5.0

#: dense tensor-core operations per SM and clock at the densest precision each architecture has (FLOPs, an FMA = 2)
_TENSOR_OPS_PER_SM_CLK = {7: 2048, 8: 4096, 9: 8192, 10: 32768, 12: 32768}
#: (DRAM bytes/s, SM clock Hz) by device name, where the driver reports no clocks
_BY_NAME = (("H200", 4.8e12, 1.98e9), ("H100 PCIe", 2.0e12, 1.755e9), ("H100 NVL", 3.9e12, 1.785e9),
            ("H100", 3.35e12, 1.98e9), ("H800", 3.35e12, 1.98e9), ("A100", 2.04e12, 1.41e9),
            ("B200", 8.0e12, 1.965e9), ("GB200", 8.0e12, 2.0e9), ("L40S", 0.864e12, 2.52e9))
# CUdevice_attribute values
_CLOCK_RATE, _MEM_CLOCK_RATE, _BUS_WIDTH, _SM_COUNT, _L2 = 13, 36, 37, 16, 38


@dataclass
class Peaks:
    """What the device can do: bytes/s from DRAM (and from L2), FLOP/s, L2 bytes, and where the numbers came from."""

    dram_bytes_s: float
    l2_bytes_s: float
    flops_s: float
    l2_bytes: int
    source: str
    margin: float

    def to_json(self) -> dict[str, Any]:
        return {"dram_GBs": round(self.dram_bytes_s / 1e9, 1), "l2_GBs": round(self.l2_bytes_s / 1e9, 1),
                "TFLOPs": round(self.flops_s / 1e12, 1) if self.flops_s else None, "l2_bytes": self.l2_bytes,
                "source": self.source, "margin": self.margin}


def cuda_peaks() -> Peaks:
    import torch

    dev = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(dev)
    attr: dict[int, int] = {}
    try:
        cu = ctypes.CDLL("libcuda.so.1")
        handle = ctypes.c_int()
        if cu.cuCtxGetDevice(ctypes.byref(handle)) == 0:
            for a in (_CLOCK_RATE, _MEM_CLOCK_RATE, _BUS_WIDTH, _SM_COUNT, _L2):
                v = ctypes.c_int()
                if cu.cuDeviceGetAttribute(ctypes.byref(v), ctypes.c_int(a), handle) == 0 and v.value > 0:
                    attr[a] = v.value
    except OSError:
        pass
    named = next((row for row in _BY_NAME if row[0] in props.name), None)
    sms = attr.get(_SM_COUNT, props.multi_processor_count)
    if _MEM_CLOCK_RATE in attr and _BUS_WIDTH in attr:
        dram = 2 * attr[_MEM_CLOCK_RATE] * 1e3 * attr[_BUS_WIDTH] / 8
        source = "driver attributes"
    else:
        dram = named[1] if named else 10e12
        source = f"table ({named[0]})" if named else "fallback (10 TB/s)"
    clock = attr[_CLOCK_RATE] * 1e3 if _CLOCK_RATE in attr else (named[2] if named else 2.5e9)
    per_clk = _TENSOR_OPS_PER_SM_CLK.get(props.major, 65536)
    l2 = attr.get(_L2, getattr(props, "L2_cache_size", 0))
    return Peaks(dram_bytes_s=dram, l2_bytes_s=L2_OVER_DRAM * dram, flops_s=sms * clock * per_clk, l2_bytes=int(l2),
                 source=f"{props.name}: {source}", margin=GPU_MARGIN)


def cpu_copy_seconds(nbytes: int, repeats: int = 7) -> float:
    """Median seconds of a copy moving `nbytes` in all (half read, half written), warm, on torch's threads."""
    import torch

    from evoengineer.evaluators.timing import time_samples

    src = torch.empty(max(nbytes // 2, 64), dtype=torch.uint8).random_(0, 255)
    dst = torch.empty_like(src)
    return statistics.median(time_samples(lambda: dst.copy_(src), device="cpu", warmup=1, repeats=repeats)) * 1e-6


class PhysicsGate:
    """Judges one timed shape's time against the bounds its declared work allows."""

    def __init__(self, device: str, *, l2_flush: bool):
        self.device = device
        self.l2_flush = l2_flush
        self.peaks = cuda_peaks() if device == "cuda" else None
        self._cpu_copy: dict[int, float] = {}

    def describe(self) -> dict[str, Any]:
        if self.peaks is not None:
            return self.peaks.to_json()
        return {"cpu_copy_GBs": {str(n): round(n / s / 1e9, 1) for n, s in self._cpu_copy.items()},
                "margin": CPU_MARGIN}

    def prepare(self, min_bytes: int) -> None:
        """CPU: measure the copy bound for this many bytes (at worker start, not in a candidate's time)."""
        if self.device == "cpu" and min_bytes > 0 and min_bytes not in self._cpu_copy:
            self._cpu_copy[min_bytes] = cpu_copy_seconds(min_bytes)

    def verdict(self, *, time_us: float, min_bytes: int, flops: int) -> str | None:
        """None if the time is possible; else why not, in one line."""
        secs = time_us * 1e-6
        if secs <= 0:
            return f"a time of {time_us:g} us"
        if self.peaks is not None:
            p = self.peaks
            bw, where = p.dram_bytes_s, "DRAM"
            if not self.l2_flush and min_bytes > 0:
                # warm L2 may serve up to its size of the declared bytes at L2's rate, the rest comes from DRAM
                from_l2 = min(min_bytes, p.l2_bytes)
                bw = min_bytes / (from_l2 / p.l2_bytes_s + (min_bytes - from_l2) / p.dram_bytes_s)
                where = "L2 (warm) and DRAM"
            if min_bytes and min_bytes / secs > p.margin * bw:
                return (f"{min_bytes / secs / 1e9:.0f} GB/s for the declared {min_bytes} bytes exceeds {p.margin:g} x "
                        f"the {where} peak of {bw / 1e9:.0f} GB/s ({p.source})")
            if flops and p.flops_s and flops / secs > p.margin * p.flops_s:
                return (f"{flops / secs / 1e12:.1f} TFLOP/s for the declared {flops} FLOPs exceeds {p.margin:g} x the "
                        f"peak of {p.flops_s / 1e12:.0f} TFLOP/s ({p.source})")
            return None
        copy_s = self._cpu_copy.get(min_bytes)
        if min_bytes and copy_s and secs * CPU_MARGIN < copy_s:
            return (f"{min_bytes / secs / 1e9:.1f} GB/s for the declared {min_bytes} bytes is over {CPU_MARGIN:g} x a "
                    f"measured copy of as many bytes ({min_bytes / copy_s / 1e9:.1f} GB/s)")
        return None
