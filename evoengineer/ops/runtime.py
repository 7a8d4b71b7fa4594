"""A searched kernel as a PyTorch custom op, built on first use. Torch only: `evoengineer export` copies this file
(with msda_reference.py) into the package it writes, and `evoengineer.load` uses it in place.

A kernel folder holds `kernel.json` (the elite: hash, params, metrics, and `build`: task, signature, backend, arch,
flags), the recorded kernel source, the family binding with its header, and the shim naming the module. `KernelOp`
compiles them into one extension through torch.utils.cpp_extension (cached by content in the build folder), registers
`torch.library` custom ops with fake (meta) implementations, so torch.compile(fullgraph=True) and CUDA graph capture
work, and exposes the calling convention users already have:

* msda: ``ms_deform_attn(value, value_spatial_shapes, value_level_start_index, sampling_locations,
  attention_weights, im2col_step=64)`` as in Deformable DETR (output ``[N, Lq, M * D]``);
* sdpa: ``scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
  scale=None, enable_gqa=False, *, k_scale=None, v_scale=None)`` as torch's (k_scale/v_scale: FP8 K/V);
* decode: ``decode_attention(query, key_cache, value_cache, seq_lens, *, scale=None, k_scale=None, v_scale=None)``:
  query ``[B, Hq, Sq <= 16, D]`` against a KV cache ``[B, Hkv, Sk, D]`` (Hq a multiple of Hkv: grouped-query
  attention), sequence b seeing its first ``seq_lens[b]`` keys.

`ShapeDispatch` holds several such kernels, each the fastest of its search on one timed shape, and runs per call the
one whose shape is nearest to the inputs (built when a call first needs it; `build()` builds them all).

Inputs outside the compiled signature raise ValueError/TypeError naming the argument and both values, unless the op
was made with ``fallback="reference"``: then the plain-PyTorch reference computes them (warned once). The kernels
are forward-only; gradients come from the reference's backward (a second custom op, so compiled graphs stay whole).
"""

import hashlib
import json
import math
import os
import warnings
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

from .msda_reference import msda_reference, msda_reference_backward

try:  # an exported package carries its own copy of the flag whitelist
    from .flags import ARCH, flag_problem
except ImportError:
    from evoengineer.space.flags import ARCH, flag_problem

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
           "float8_e4m3": torch.float8_e4m3fn}
_NAMESPACE = "evoengineer"


def _attention_backward(qf: torch.Tensor, kd: torch.Tensor, vd: torch.Tensor, do: torch.Tensor,
                        masked: torch.Tensor | None, scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of softmax(q k^T scale, keys where `masked` is true left out) v, all float32, written out (no
    autograd: this runs inside a custom op, where autograd is off)."""
    s = torch.matmul(qf, kd.transpose(-1, -2)) * scale
    if masked is not None:
        s = s.masked_fill(masked, float("-inf"))
    p = torch.softmax(s, dim=-1)
    out = torch.matmul(p, vd)
    dv = torch.matmul(p.transpose(-1, -2), do)
    dp = torch.matmul(do, vd.transpose(-1, -2))
    ds = p * (dp - (do * out).sum(-1, keepdim=True))
    return torch.matmul(ds, kd) * scale, torch.matmul(ds.transpose(-1, -2), qf) * scale, dv


def sdpa_reference_backward(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            k_scale: torch.Tensor, v_scale: torch.Tensor, is_causal: bool,
                            scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of softmax(q k^T scale) v (top-left causal mask) in float32. K/V are dequantized with their
    per-head scales; their gradients are with respect to the stored values."""
    ks, vs = k_scale.float().view(1, -1, 1, 1), v_scale.float().view(1, -1, 1, 1)
    masked = None
    if is_causal:
        masked = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).triu(1)
    dq, dk, dv = _attention_backward(q.float(), k.float() * ks, v.float() * vs, grad.float(), masked, scale)
    return dq, dk * ks, dv * vs


def _decode_operands(q, k, v, k_scale, v_scale, seq_lens):
    """float32 dequantized K/V expanded to the query heads, and the mask of the keys past each sequence's length
    (clamped to [1, Sk], as the kernels do)."""
    G = q.shape[1] // k.shape[1]
    kd = (k.float() * k_scale.float().view(1, -1, 1, 1)).repeat_interleave(G, dim=1)
    vd = (v.float() * v_scale.float().view(1, -1, 1, 1)).repeat_interleave(G, dim=1)
    lens = seq_lens.long().clamp(1, k.shape[2])
    masked = torch.arange(k.shape[2], device=q.device)[None, :] >= lens[:, None]
    return kd, vd, masked[:, None, None, :]


def decode_reference(q, k, v, k_scale, v_scale, seq_lens, scale: float) -> torch.Tensor:
    """Decode attention in float32 (keys past a sequence's length left out; masked values zeroed, so that whatever
    a cache holds there never reaches the output), in q's dtype."""
    kd, vd, masked = _decode_operands(q, k, v, k_scale, v_scale, seq_lens)
    s = torch.matmul(q.float(), kd.transpose(-1, -2)) * scale
    p = torch.softmax(s.masked_fill(masked, float("-inf")), dim=-1)
    return torch.matmul(p, vd.masked_fill(masked.transpose(-1, -2), 0.0)).to(q.dtype)


def decode_reference_backward(grad, q, k, v, k_scale, v_scale, seq_lens,
                              scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of decode attention; K/V gradients summed over each group's query heads, with respect to the
    stored values (zero past each sequence's length)."""
    kd, vd, masked = _decode_operands(q, k, v, k_scale, v_scale, seq_lens)
    vd = vd.masked_fill(masked.transpose(-1, -2), 0.0)
    kd = kd.masked_fill(masked.transpose(-1, -2), 0.0)
    dq, dk, dv = _attention_backward(q.float(), kd, vd, grad.float(), masked, scale)
    B, Hkv, Sk, D = k.shape
    dk = dk.view(B, Hkv, -1, Sk, D).sum(2) * k_scale.float().view(1, -1, 1, 1)
    dv = dv.view(B, Hkv, -1, Sk, D).sum(2) * v_scale.float().view(1, -1, 1, 1)
    return dq, dk, dv


def _softmax_lp(attention: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Softmax of MSDA attention logits [N, Lq, M, L, P] over each (n, q, m)'s L * P values, in `dtype`."""
    return torch.softmax(attention.to(dtype).flatten(-2), dim=-1).view(attention.shape)


def default_build_root() -> Path:
    """Where exported kernels are compiled: $EVOENGINEER_EXPORT_CACHE, else ~/.cache/evoengineer/ops."""
    given = os.environ.get("EVOENGINEER_EXPORT_CACHE")
    return Path(given) if given else Path.home() / ".cache" / "evoengineer" / "ops"


def _dtype_name(dt: torch.dtype) -> str:
    return str(dt).removeprefix("torch.")


def arch_list(arch: str | None) -> str | None:
    """TORCH_CUDA_ARCH_LIST for a space's arch: sm_90 -> 9.0, sm_90a -> 9.0a."""
    if not arch:
        return None
    digits = arch.removeprefix("sm_")
    return f"{digits[:-1]}.{digits[-1]}" if digits[-1].isdigit() else f"{digits[:-2]}.{digits[-2:]}"


def _registered_ops() -> dict[str, tuple[Any, Any]]:
    """Custom ops registered in this process, by kernel hash, shared by every copy of this runtime (the op objects
    must stay alive: torch drops an op's kernels when its definition is garbage-collected)."""
    _loaded()  # makes the shared registry module
    import sys

    reg = sys.modules["_evoengineer_ops_loaded"]
    if not hasattr(reg, "ops"):
        reg.ops = {}  # type: ignore[attr-defined]
    return reg.ops  # type: ignore[attr-defined]


def _loaded() -> dict[str, Any]:
    """Extension modules built in this process, by module name, shared by every copy of this runtime (an exported
    package and evoengineer.load of the same kernel): an extension's name can be imported once per process."""
    import sys
    import types

    reg = sys.modules.get("_evoengineer_ops_loaded")
    if reg is None:
        reg = sys.modules.setdefault("_evoengineer_ops_loaded", types.ModuleType("_evoengineer_ops_loaded"))
        reg.modules = {}  # type: ignore[attr-defined]
    return reg.modules  # type: ignore[attr-defined]


def build_module(folder: Path, kernel: dict[str, Any], build_root: Path | None = None) -> Any:
    """Compile the folder's kernel, binding and shim into one extension (cached by the content of the sources and the
    build settings) and import it (once per process)."""
    from torch.utils import cpp_extension

    build = kernel["build"]
    # an elite.json is a file like a space file: its flags reach /bin/sh through ninja, so they pass the same
    # whitelist before anything is compiled
    for key in ("flags", "cuda_flags", "ldflags"):
        for i, flag in enumerate(build.get(key) or []):
            why = flag_problem(flag)
            if why is not None:
                raise ValueError(f"kernel {kernel['hash'][:12]}: build.{key}[{i}]: flag {flag!r} refused: {why}")
    if build.get("arch") is not None and not ARCH.fullmatch(str(build["arch"])):
        raise ValueError(f"kernel {kernel['hash'][:12]}: build.arch {build['arch']!r} refused: expected sm_NN[a]")
    name = kernel["module"]
    if name in _loaded():
        return _loaded()[name]
    sources = [folder / kernel["source_file"], folder / "binding.cpp", folder / "shim.cpp"]
    digest = hashlib.sha256()
    for p in sources + [folder / "candidate_module.h"]:
        digest.update(p.read_bytes())
    digest.update(json.dumps({k: build.get(k) for k in ("flags", "cuda_flags", "ldflags", "arch", "backend")},
                             sort_keys=True).encode())
    digest.update(torch.__version__.encode())
    out = (build_root or default_build_root()) / f"{name}-{digest.hexdigest()[:12]}"
    out.mkdir(parents=True, exist_ok=True)
    cuda = build["backend"] == "cuda"
    if cuda:
        if not torch.cuda.is_available():
            raise RuntimeError(f"kernel {kernel['hash'][:12]} is a CUDA kernel ({build.get('arch')}) and this "
                               "machine has no usable GPU")
        arch = arch_list(build.get("arch"))
        if arch:
            os.environ["TORCH_CUDA_ARCH_LIST"] = arch
    flags = list(build.get("flags", [])) + (["-DEVO_WITH_CUDA"] if cuda else [])
    cuda_flags = (list(build.get("cuda_flags", [])) + ["-DEVO_WITH_CUDA"]) if cuda else None
    module = cpp_extension.load(name=name, sources=[str(s) for s in sources], extra_cflags=flags,
                                extra_cuda_cflags=cuda_flags, extra_ldflags=list(build.get("ldflags", [])),
                                build_directory=str(out), with_cuda=cuda, is_python_module=True, verbose=False)
    _loaded()[name] = module
    return module


class KernelOp:
    """One built kernel, registered as custom ops, with its user-facing function (`function`)."""

    def __init__(self, folder: str | Path, *, fallback: str | None = None, build_root: str | Path | None = None):
        if fallback not in (None, "reference"):
            raise ValueError(f"fallback: None or 'reference', got {fallback!r}")
        if not hasattr(torch, "library") or not hasattr(torch.library, "custom_op"):
            raise RuntimeError(f"torch {torch.__version__}: exported kernels need torch.library.custom_op "
                               "(torch >= 2.4)")
        self.folder = Path(folder)
        self.kernel = json.loads((self.folder / "kernel.json").read_text())
        self.build = self.kernel["build"]
        self.task = self.build["task"]
        self.signature = dict(self.build["signature"])
        self.fallback = fallback
        self._warned = False
        self.module = build_module(self.folder, self.kernel, Path(build_root) if build_root else None)
        self.device_type = "cuda" if self.build["backend"] == "cuda" else "cpu"
        key = self.kernel["hash"][:16]
        ops = _registered_ops()
        if key in ops:  # the same kernel loaded again in this process (by any copy of this runtime): share its ops
            self.op, self.backward_op = ops[key]
        else:
            register = {"msda": self._register_msda, "sdpa": self._register_sdpa,
                        "decode": self._register_decode}.get(self.task)
            if register is None:
                raise ValueError(f"kernel.json: task {self.task!r} has no exported op (msda, sdpa, decode)")
            # Registered once per process and never again: a second custom_op of the same name fails halfway, and
            # the half-made definition, once garbage-collected, takes kernels of the first one with it (seen as
            # intermittent crashes when an exported package and evoengineer.load held the same kernel).
            register(f"{self.task}_{key}")
            ops[key] = (self.op, self.backward_op)
        self.function: Callable[..., torch.Tensor] = {"msda": self.ms_deform_attn,
                                                      "sdpa": self.scaled_dot_product_attention,
                                                      "decode": self.decode_attention}[self.task]

    # ---- shared -----------------------------------------------------------------------------------------------------
    def _outside(self, why: str, kind: type[Exception] = ValueError) -> None:
        """Inputs the kernel was not compiled for: raise, or (fallback="reference") warn once and let the caller
        use the reference."""
        if self.fallback != "reference":
            raise kind(why)
        if not self._warned:
            warnings.warn(f"kernel {self.kernel['hash'][:12]}: {why}; computing with the PyTorch reference "
                          "(fallback='reference'; warned once)", stacklevel=3)
            self._warned = True

    def _check_device(self, name: str, t: torch.Tensor, device: torch.device) -> str | None:
        if t.device.type != self.device_type:
            return f"{name}: on {t.device}, this kernel runs on {self.device_type}"
        if t.device != device:
            return f"{name}: on {t.device}, expected {device} (the device of the first input)"
        return None

    # ---- msda -------------------------------------------------------------------------------------------------------
    def _register_msda(self, name: str) -> None:
        module = self.module
        logits = self.msda_logits

        @torch.library.custom_op(f"{_NAMESPACE}::{name}", mutates_args=())
        def op(value: torch.Tensor, spatial_shapes: torch.Tensor, level_start_index: torch.Tensor,
               sampling_locations: torch.Tensor, attention_weights: torch.Tensor) -> torch.Tensor:
            N, _, M, D = value.shape
            out = value.new_empty((N, sampling_locations.shape[1], M * D))
            rc = module.forward(value, spatial_shapes, level_start_index, sampling_locations, attention_weights, out)
            if rc != 0:
                raise RuntimeError(f"MSDA kernel returned status {rc}")
            return out

        @op.register_fake
        def _(value, spatial_shapes, level_start_index, sampling_locations, attention_weights):
            N, _, M, D = value.shape
            return value.new_empty((N, sampling_locations.shape[1], M * D))

        @torch.library.custom_op(f"{_NAMESPACE}::{name}_backward", mutates_args=())
        def backward_op(grad: torch.Tensor, value: torch.Tensor, spatial_shapes: torch.Tensor,
                        level_start_index: torch.Tensor, sampling_locations: torch.Tensor,
                        attention_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            dt = torch.float64 if value.dtype == torch.float64 else torch.float32
            weights = _softmax_lp(attention_weights, dt) if logits else attention_weights
            gv, gl, ga = msda_reference_backward(grad, value, spatial_shapes, level_start_index, sampling_locations,
                                                 weights, dtype=dt)
            if logits:  # through the softmax over L * P: w * (g - sum(g * w))
                w, g = weights.to(dt).flatten(-2), ga.to(dt).flatten(-2)
                ga = (w * (g - (g * w).sum(-1, keepdim=True))).view(attention_weights.shape)
            return gv.to(value.dtype), gl.to(sampling_locations.dtype), ga.to(attention_weights.dtype)

        @backward_op.register_fake
        def _(grad, value, spatial_shapes, level_start_index, sampling_locations, attention_weights):
            return (torch.empty_like(value), torch.empty_like(sampling_locations),
                    torch.empty_like(attention_weights))

        def setup_context(ctx, inputs, output):
            ctx.save_for_backward(*inputs)

        def backward(ctx, grad):
            value, shapes, starts, loc, attn = ctx.saved_tensors
            gv, gl, ga = backward_op(grad.contiguous(), value, shapes, starts, loc, attn)
            return gv, None, None, gl, ga

        op.register_autograd(backward, setup_context=setup_context)
        self.op, self.backward_op = op, backward_op

    @property
    def msda_logits(self) -> bool:
        """The kernel takes attention logits (signature ATTENTION = "logits") and softmaxes them over L * P."""
        return self.signature.get("ATTENTION", "weights") == "logits"

    def msda_misfit(self, value, spatial_shapes, level_start_index, sampling_locations,
                    attention_weights) -> tuple[str, type[Exception]] | None:
        """Why these inputs are outside what the kernel was compiled for (static facts only: no data is read), or
        None. The binding checks the same and the index values again at run time."""
        sig = self.signature
        want_dtype = _DTYPES[sig.get("VALUE_DTYPE", "float32")]
        L, P, D = int(sig["L"]), int(sig["P"]), int(sig["D"])
        named = {"value": value, "value_spatial_shapes": spatial_shapes,
                 "value_level_start_index": level_start_index, "sampling_locations": sampling_locations,
                 "attention_weights": attention_weights}
        for n, t in named.items():
            if not isinstance(t, torch.Tensor):
                return f"{n}: expected a tensor, got {type(t).__name__}", TypeError
        for n, t in named.items():
            bad = self._check_device(n, t, value.device)
            if bad:
                return bad, ValueError
        dims = {"value": 4, "sampling_locations": 6, "attention_weights": 5, "value_spatial_shapes": 2,
                "value_level_start_index": 1}
        for n, d in dims.items():
            if named[n].dim() != d:
                return f"{n}: expected {d} dimensions, got {named[n].dim()} (shape {tuple(named[n].shape)})", \
                    ValueError
        if value.dtype != want_dtype:
            return (f"value: dtype {_dtype_name(value.dtype)}, but this kernel was compiled for "
                    f"{_dtype_name(want_dtype)}"), TypeError
        for n in ("sampling_locations", "attention_weights"):
            if named[n].dtype != torch.float32:
                return f"{n}: dtype {_dtype_name(named[n].dtype)}, expected float32", TypeError
        for n in ("value_spatial_shapes", "value_level_start_index"):
            if named[n].dtype != torch.int64:
                return f"{n}: dtype {_dtype_name(named[n].dtype)}, expected int64", TypeError
        if value.shape[3] != D:
            return f"value: head dim D = {value.shape[3]} (size 3), but this kernel was compiled for D = {D}", \
                ValueError
        if sampling_locations.shape[3] != L:
            return (f"sampling_locations: L = {sampling_locations.shape[3]} levels (size 3), but this kernel was "
                    f"compiled for L = {L}"), ValueError
        if sampling_locations.shape[4] != P:
            return (f"sampling_locations: P = {sampling_locations.shape[4]} points (size 4), but this kernel was "
                    f"compiled for P = {P}"), ValueError
        N, _, M, _ = value.shape
        Lq = sampling_locations.shape[1]
        checks = [("sampling_locations", sampling_locations.shape, (N, Lq, M, L, P, 2)),
                  ("attention_weights", attention_weights.shape, (N, Lq, M, L, P)),
                  ("value_spatial_shapes", spatial_shapes.shape, (L, 2)),
                  ("value_level_start_index", level_start_index.shape, (L,))]
        for n, got, want in checks:
            if tuple(got) != want:
                return f"{n}: shape {tuple(got)}, expected {want} (from value {tuple(value.shape)})", ValueError
        return None

    def ms_deform_attn(self, value: torch.Tensor, value_spatial_shapes: torch.Tensor,
                       value_level_start_index: torch.Tensor, sampling_locations: torch.Tensor,
                       attention_weights: torch.Tensor, im2col_step: int = 64) -> torch.Tensor:
        """Deformable DETR's MSDA forward: value [N, S, M, D], spatial shapes [L, 2] (H, W), level start index [L],
        sampling locations [N, Lq, M, L, P, 2] in [0, 1], attention weights [N, Lq, M, L, P] -> [N, Lq, M * D].
        `im2col_step` is accepted for compatibility and ignored."""
        args = (value, value_spatial_shapes, value_level_start_index, sampling_locations, attention_weights)
        misfit = self.msda_misfit(*args)
        if misfit is not None:
            self._outside(*misfit)
            dt = torch.float64 if value.dtype == torch.float64 else torch.float32
            if self.msda_logits:
                args = (*args[:4], _softmax_lp(attention_weights, dt))
            return msda_reference(*args, dtype=dt).to(value.dtype)
        return self.op(*(t.contiguous() for t in args))

    # ---- sdpa -------------------------------------------------------------------------------------------------------
    def _register_sdpa(self, name: str) -> None:
        module = self.module

        @torch.library.custom_op(f"{_NAMESPACE}::{name}", mutates_args=())
        def op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_scale: torch.Tensor, v_scale: torch.Tensor,
               is_causal: bool, scale: float) -> torch.Tensor:
            out = torch.empty_like(q)
            rc = module.forward(q, k, v, k_scale, v_scale, out, is_causal, scale)
            if rc != 0:
                raise RuntimeError(f"SDPA kernel returned status {rc}")
            return out

        @op.register_fake
        def _(q, k, v, k_scale, v_scale, is_causal, scale):
            return torch.empty_like(q)

        @torch.library.custom_op(f"{_NAMESPACE}::{name}_backward", mutates_args=())
        def backward_op(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        k_scale: torch.Tensor, v_scale: torch.Tensor, is_causal: bool,
                        scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            gq, gk, gv = sdpa_reference_backward(grad, q, k, v, k_scale, v_scale, is_causal, scale)
            return gq.to(q.dtype), gk.to(k.dtype), gv.to(v.dtype)

        @backward_op.register_fake
        def _(grad, q, k, v, k_scale, v_scale, is_causal, scale):
            return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

        def setup_context(ctx, inputs, output):
            q, k, v, k_scale, v_scale, is_causal, scale = inputs
            ctx.save_for_backward(q, k, v, k_scale, v_scale)
            ctx.is_causal, ctx.scale = is_causal, scale

        def backward(ctx, grad):
            q, k, v, k_scale, v_scale = ctx.saved_tensors
            gq, gk, gv = backward_op(grad.contiguous(), q, k, v, k_scale, v_scale, ctx.is_causal, ctx.scale)
            return gq, gk, gv, None, None, None, None

        op.register_autograd(backward, setup_context=setup_context)
        self.op, self.backward_op = op, backward_op

    def sdpa_misfit(self, query, key, value, attn_mask, dropout_p, enable_gqa, k_scale,
                    v_scale) -> tuple[str, type[Exception]] | None:
        sig = self.signature
        head_dim = int(sig["HEAD_DIM"])
        q_dt = _DTYPES[sig.get("Q_DTYPE", "float16")]
        kv_dt = _DTYPES[sig.get("KV_DTYPE", sig.get("Q_DTYPE", "float16"))]
        named = {"query": query, "key": key, "value": value}
        for n, t in named.items():
            if not isinstance(t, torch.Tensor):
                return f"{n}: expected a tensor, got {type(t).__name__}", TypeError
            bad = self._check_device(n, t, query.device)
            if bad:
                return bad, ValueError
            if t.dim() != 4:
                return f"{n}: expected 4 dimensions [B, H, S, D], got {t.dim()} (shape {tuple(t.shape)})", ValueError
        if attn_mask is not None:
            return "attn_mask: this kernel takes no mask (is_causal only)", ValueError
        if dropout_p:
            return f"dropout_p: {dropout_p}, this kernel has no dropout", ValueError
        if query.dtype != q_dt:
            return (f"query: dtype {_dtype_name(query.dtype)}, but this kernel was compiled for "
                    f"{_dtype_name(q_dt)}"), TypeError
        for n in ("key", "value"):
            if named[n].dtype != kv_dt:
                return (f"{n}: dtype {_dtype_name(named[n].dtype)}, but this kernel was compiled for "
                        f"{_dtype_name(kv_dt)}"), TypeError
        if query.shape[3] != head_dim:
            return (f"query: head dim {query.shape[3]} (size 3), but this kernel was compiled for head dim "
                    f"{head_dim}"), ValueError
        B, H, _, D = query.shape
        if tuple(key.shape[:2]) != (B, H) or key.shape[3] != D:
            what = " (grouped-query attention is not in this kernel)" if enable_gqa or key.shape[1] != H else ""
            return f"key: shape {tuple(key.shape)}, expected [{B}, {H}, Sk, {D}] (from query){what}", ValueError
        if value.shape != key.shape:
            return f"value: shape {tuple(value.shape)}, expected the shape of key {tuple(key.shape)}", ValueError
        for n, s in (("k_scale", k_scale), ("v_scale", v_scale)):
            if s is not None and (not isinstance(s, torch.Tensor) or tuple(s.shape) != (H,)
                                  or s.dtype != torch.float32):
                return f"{n}: expected a float32 tensor [H] = [{H}]", ValueError
        if kv_dt != torch.float8_e4m3fn and (k_scale is not None or v_scale is not None):
            return "k_scale/v_scale: only for a kernel compiled for float8 K/V", ValueError
        return None

    def scaled_dot_product_attention(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                     attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0,
                                     is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False,
                                     *, k_scale: torch.Tensor | None = None,
                                     v_scale: torch.Tensor | None = None) -> torch.Tensor:
        """torch.nn.functional.scaled_dot_product_attention on this kernel (no mask, no dropout; causal is
        top-left aligned). FP8 K/V kernels take per-head float32 `k_scale`/`v_scale` (real = stored x scale)."""
        misfit = self.sdpa_misfit(query, key, value, attn_mask, dropout_p, enable_gqa, k_scale, v_scale)
        scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
        if misfit is not None:
            self._outside(*misfit)
            k = key if k_scale is None else (key.float() * k_scale.view(1, -1, 1, 1)).to(query.dtype)
            v = value if v_scale is None else (value.float() * v_scale.view(1, -1, 1, 1)).to(query.dtype)
            gqa = {"enable_gqa": True} if enable_gqa else {}
            return F.scaled_dot_product_attention(query, k, v, attn_mask=attn_mask, dropout_p=dropout_p,
                                                  is_causal=is_causal, scale=scale, **gqa)
        H = query.shape[1]
        ones = torch.ones(H, dtype=torch.float32, device=query.device)
        ks = ones if k_scale is None else k_scale.contiguous()
        vs = ones if v_scale is None else v_scale.contiguous()
        return self.op(query.contiguous(), key.contiguous(), value.contiguous(), ks, vs, bool(is_causal), scale)

    # ---- decode -----------------------------------------------------------------------------------------------------
    def _register_decode(self, name: str) -> None:
        module = self.module

        @torch.library.custom_op(f"{_NAMESPACE}::{name}", mutates_args=())
        def op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_scale: torch.Tensor, v_scale: torch.Tensor,
               seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
            out = torch.empty_like(q)
            rc = module.forward(q, k, v, k_scale, v_scale, seq_lens, out, scale)
            if rc != 0:
                raise RuntimeError(f"decode kernel returned status {rc}")
            return out

        @op.register_fake
        def _(q, k, v, k_scale, v_scale, seq_lens, scale):
            return torch.empty_like(q)

        @torch.library.custom_op(f"{_NAMESPACE}::{name}_backward", mutates_args=())
        def backward_op(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        k_scale: torch.Tensor, v_scale: torch.Tensor, seq_lens: torch.Tensor,
                        scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            gq, gk, gv = decode_reference_backward(grad, q, k, v, k_scale, v_scale, seq_lens, scale)
            return gq.to(q.dtype), gk.to(k.dtype), gv.to(v.dtype)

        @backward_op.register_fake
        def _(grad, q, k, v, k_scale, v_scale, seq_lens, scale):
            return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

        def setup_context(ctx, inputs, output):
            q, k, v, k_scale, v_scale, seq_lens, scale = inputs
            ctx.save_for_backward(q, k, v, k_scale, v_scale, seq_lens)
            ctx.scale = scale

        def backward(ctx, grad):
            q, k, v, k_scale, v_scale, seq_lens = ctx.saved_tensors
            gq, gk, gv = backward_op(grad.contiguous(), q, k, v, k_scale, v_scale, seq_lens, ctx.scale)
            return gq, gk, gv, None, None, None, None

        op.register_autograd(backward, setup_context=setup_context)
        self.op, self.backward_op = op, backward_op

    def decode_misfit(self, query, key_cache, value_cache, seq_lens, k_scale,
                      v_scale) -> tuple[str, type[Exception]] | None:
        sig = self.signature
        head_dim = int(sig["HEAD_DIM"])
        q_dt = _DTYPES[sig.get("Q_DTYPE", "float16")]
        kv_dt = _DTYPES[sig.get("KV_DTYPE", sig.get("Q_DTYPE", "float16"))]
        named = {"query": query, "key_cache": key_cache, "value_cache": value_cache, "seq_lens": seq_lens}
        for n, t in named.items():
            if not isinstance(t, torch.Tensor):
                return f"{n}: expected a tensor, got {type(t).__name__}", TypeError
            bad = self._check_device(n, t, query.device)
            if bad:
                return bad, ValueError
            dims = 1 if n == "seq_lens" else 4
            if t.dim() != dims:
                return f"{n}: expected {dims} dimensions, got {t.dim()} (shape {tuple(t.shape)})", ValueError
        if query.dtype != q_dt:
            return (f"query: dtype {_dtype_name(query.dtype)}, but this kernel was compiled for "
                    f"{_dtype_name(q_dt)}"), TypeError
        for n in ("key_cache", "value_cache"):
            if named[n].dtype != kv_dt:
                return (f"{n}: dtype {_dtype_name(named[n].dtype)}, but this kernel was compiled for "
                        f"{_dtype_name(kv_dt)}"), TypeError
        if seq_lens.dtype not in (torch.int32, torch.int64):
            return f"seq_lens: dtype {_dtype_name(seq_lens.dtype)}, expected int32 (or int64)", TypeError
        B, Hq, Sq, D = query.shape
        if D != head_dim:
            return f"query: head dim {D} (size 3), but this kernel was compiled for head dim {head_dim}", ValueError
        if not 1 <= Sq <= 16:
            return f"query: {Sq} query rows (size 2); this kernel decodes 1 to 16", ValueError
        Hkv = key_cache.shape[1]
        if key_cache.shape[0] != B or key_cache.shape[3] != D or Hkv == 0 or Hq % Hkv or key_cache.shape[2] == 0:
            return (f"key_cache: shape {tuple(key_cache.shape)}, expected [{B}, Hkv, Sk >= 1, {D}] with Hkv "
                    f"dividing the {Hq} query heads"), ValueError
        if value_cache.shape != key_cache.shape:
            return (f"value_cache: shape {tuple(value_cache.shape)}, expected the shape of key_cache "
                    f"{tuple(key_cache.shape)}"), ValueError
        if tuple(seq_lens.shape) != (B,):
            return f"seq_lens: shape {tuple(seq_lens.shape)}, expected [B] = [{B}]", ValueError
        for n, s in (("k_scale", k_scale), ("v_scale", v_scale)):
            if s is not None and (not isinstance(s, torch.Tensor) or tuple(s.shape) != (Hkv,)
                                  or s.dtype != torch.float32 or s.device != query.device):
                return f"{n}: expected a float32 tensor [Hkv] = [{Hkv}] on {query.device}", ValueError
        if kv_dt != torch.float8_e4m3fn and (k_scale is not None or v_scale is not None):
            return "k_scale/v_scale: only for a kernel compiled for float8 K/V", ValueError
        return None

    def decode_attention(self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                         seq_lens: torch.Tensor, *, scale: float | None = None, k_scale: torch.Tensor | None = None,
                         v_scale: torch.Tensor | None = None) -> torch.Tensor:
        """Attention of query [B, Hq, Sq, D] over a KV cache [B, Hkv, Sk, D] (Hq = G x Hkv): every query row of
        sequence b sees keys 0 .. seq_lens[b] - 1 (lengths are clamped to [1, Sk] on the device, not checked: that
        would cost a device-to-host copy). FP8 caches take per-KV-head float32 `k_scale`/`v_scale`."""
        misfit = self.decode_misfit(query, key_cache, value_cache, seq_lens, k_scale, v_scale)
        scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
        Hkv = key_cache.shape[1] if isinstance(key_cache, torch.Tensor) and key_cache.dim() == 4 else 1
        ones = torch.ones(Hkv, dtype=torch.float32, device=query.device)
        ks = ones if k_scale is None else k_scale.contiguous()
        vs = ones if v_scale is None else v_scale.contiguous()
        if misfit is not None:
            self._outside(*misfit)
            return decode_reference(query, key_cache, value_cache, ks, vs, seq_lens, scale)
        return self.op(query.contiguous(), key_cache.contiguous(), value_cache.contiguous(), ks, vs,
                       seq_lens.to(torch.int32).contiguous(), scale)


# ---- several kernels, one per timed shape ----------------------------------------------------------------------------
def _arg(args: tuple, kwargs: dict, i: int, name: str) -> Any:
    return args[i] if len(args) > i else kwargs.get(name)


def _msda_call(args: tuple, kwargs: dict) -> tuple[dict[str, int], tuple]:
    value, loc = _arg(args, kwargs, 0, "value"), _arg(args, kwargs, 3, "sampling_locations")
    N, S, M, Lq = int(value.shape[0]), int(value.shape[1]), int(value.shape[2]), int(loc.shape[1])
    return {"N": N, "Lq": Lq, "M": M, "S": S}, (True if Lq == S else False,)  # a plain bool, also under torch.compile


def _msda_spec(spec: dict[str, Any]) -> tuple[dict[str, int], tuple]:
    S = sum(h * w for h, w in spec["levels"])
    return {"N": spec["N"], "Lq": spec["Lq"], "M": spec["M"], "S": S}, (spec["Lq"] == S,)


def _sdpa_call(args: tuple, kwargs: dict) -> tuple[dict[str, int], tuple]:
    q, k = _arg(args, kwargs, 0, "query"), _arg(args, kwargs, 1, "key")
    causal = bool(_arg(args, kwargs, 5, "is_causal"))
    return {"B": int(q.shape[0]), "H": int(q.shape[1]), "Sq": int(q.shape[2]), "Sk": int(k.shape[2])}, (causal,)


def _sdpa_spec(spec: dict[str, Any]) -> tuple[dict[str, int], tuple]:
    return {k: spec[k] for k in ("B", "H", "Sq", "Sk")}, (bool(spec.get("causal", False)),)


def _decode_call(args: tuple, kwargs: dict) -> tuple[dict[str, int], tuple]:
    q, kc = _arg(args, kwargs, 0, "query"), _arg(args, kwargs, 1, "key_cache")
    return {"B": int(q.shape[0]), "Hq": int(q.shape[1]), "Sq": int(q.shape[2]), "Hkv": int(kc.shape[1]),
            "Sk": int(kc.shape[2])}, ()


def _decode_spec(spec: dict[str, Any]) -> tuple[dict[str, int], tuple]:
    return {"B": spec["B"], "Hq": spec["Hq"], "Sq": spec.get("Sq", 1), "Hkv": spec["Hkv"], "Sk": spec["Sk"]}, ()


#: task -> (features of a call's arguments, features of a recorded shape spec): sizes compared on a log scale, and
#: a kind that must match when a recorded shape matches it (MSDA: Lq == S, encoder self-attention; SDPA: causal)
SHAPE_FEATURES: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {
    "msda": (_msda_call, _msda_spec), "sdpa": (_sdpa_call, _sdpa_spec), "decode": (_decode_call, _decode_spec)}
_FUNCTIONS = {"msda": "ms_deform_attn", "sdpa": "scaled_dot_product_attention", "decode": "decode_attention"}


def shape_distance(a: dict[str, int], b: dict[str, int]) -> float:
    """Sum of |log(a/b)| over the sizes both have."""
    return sum(abs(math.log(max(int(a[k]), 1) / max(int(b[k]), 1))) for k in a if k in b)


class ShapeDispatch:
    """Kernels of one family, each the fastest of its search on one timed shape: a call runs the kernel whose
    recorded shape is nearest to its inputs (`choose`), built on first use (`KernelOp`; its signature checks and
    fallback apply as they do alone). `table`: one row per shape (shape, shape_spec, hash, p50_us, folder)."""

    def __init__(self, table: list[dict[str, Any]], *, fallback: str | None = None,
                 build_root: str | Path | None = None):
        if not table:
            raise ValueError("ShapeDispatch: no kernels")
        self.table = [dict(row, folder=Path(row["folder"])) for row in table]
        self.fallback = fallback
        self.build_root = build_root
        kernels = [json.loads((row["folder"] / "kernel.json").read_text()) for row in self.table]
        tasks = {k["build"]["task"] for k in kernels}
        if len(tasks) != 1 or next(iter(tasks)) not in SHAPE_FEATURES:
            raise ValueError(f"ShapeDispatch: kernels of one family (msda, sdpa, decode) expected, got {sorted(tasks)}")
        self.task = tasks.pop()
        self.signature = dict(kernels[0]["build"]["signature"])
        self.ops: dict[str, KernelOp] = {}  # by hash: the kernels built so far
        self.calls: dict[str, int] = {row["hash"]: 0 for row in self.table}
        call_features, spec_features = SHAPE_FEATURES[self.task]
        self._call_features = call_features
        self._features = [spec_features(row["shape_spec"]) for row in self.table]
        name = _FUNCTIONS[self.task]

        def function(*args, **kwargs):
            row = self.choose(*args, **kwargs)
            self.calls[row["hash"]] += 1
            return self.op_for(row).function(*args, **kwargs)

        function.__name__ = function.__qualname__ = name
        function.__doc__ = getattr(KernelOp, name).__doc__
        self.function: Callable[..., torch.Tensor] = function

    @classmethod
    def from_file(cls, path: str | Path, **kwargs) -> "ShapeDispatch":
        """From a dispatch.json (an exported package's): `kernels` rows with folders relative to it."""
        path = Path(path)
        doc = json.loads(path.read_text())
        return cls([dict(row, folder=path.parent / row["folder"]) for row in doc["kernels"]], **kwargs)

    def choose(self, *args, **kwargs) -> dict[str, Any]:
        """The table row whose kernel a call with these arguments runs: among the recorded shapes of the call's kind
        (all, if none is), the nearest in sizes; ties to the first in the table."""
        if len(self.table) == 1:
            return self.table[0]
        try:
            sizes, kind = self._call_features(args, kwargs)
        except (AttributeError, IndexError, TypeError):
            return self.table[0]  # not tensors of the family's layout: the first kernel's checks say what is wrong
        same_kind = any(k == kind for _, k in self._features)
        best, best_d = 0, math.inf
        for i, (recorded, k) in enumerate(self._features):  # a plain loop: torch.compile traces it
            if same_kind and k != kind:
                continue
            d = shape_distance(sizes, recorded)
            if d < best_d:
                best, best_d = i, d
        return self.table[best]

    def build(self) -> "ShapeDispatch":
        """Build every kernel now (before torch.compile or CUDA graph capture, which cannot build one mid-trace)."""
        for row in self.table:
            self.op_for(row)
        return self

    def op_for(self, row: dict[str, Any]) -> KernelOp:
        """The row's kernel, built and registered on first use."""
        op = self.ops.get(row["hash"])
        if op is None:
            op = self.ops[row["hash"]] = KernelOp(row["folder"], fallback=self.fallback, build_root=self.build_root)
        return op
