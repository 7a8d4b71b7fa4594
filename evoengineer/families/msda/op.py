"""The MSDA family's op adapter (torch only: `export` copies it, with reference.py, into the package):
``ms_deform_attn(value, value_spatial_shapes, value_level_start_index, sampling_locations, attention_weights,
im2col_step=64)`` as in Deformable DETR (output ``[N, Lq, M * D]``), differentiated through the reference."""

from typing import Any

import torch

try:  # in an exported package, beside the runtime
    from .runtime import _DTYPES, _NAMESPACE, OpAdapter, _dtype_name, call_arg
except ImportError:
    from evoengineer.ops.runtime import _DTYPES, _NAMESPACE, OpAdapter, _dtype_name, call_arg
try:
    from .reference import msda_reference, msda_reference_backward
except ImportError:
    from evoengineer.families.msda.reference import msda_reference, msda_reference_backward


def _softmax_lp(attention: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Softmax of MSDA attention logits [N, Lq, M, L, P] over each (n, q, m)'s L * P values, in `dtype`."""
    return torch.softmax(attention.to(dtype).flatten(-2), dim=-1).view(attention.shape)



class MsdaOp(OpAdapter):
    """MSDA forward on the kernel (signature L, P, D, VALUE_DTYPE, ATTENTION)."""

    function_name = "ms_deform_attn"

    # ---- msda -------------------------------------------------------------------------------------------------------
    def register(self, name: str) -> tuple[Any, Any]:
        module = self.kop.module
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
        return op, backward_op

    @property
    def msda_logits(self) -> bool:
        """The kernel takes attention logits (signature ATTENTION = "logits") and softmaxes them over L * P."""
        return self.kop.signature.get("ATTENTION", "weights") == "logits"

    def msda_misfit(self, value, spatial_shapes, level_start_index, sampling_locations,
                    attention_weights) -> tuple[str, type[Exception]] | None:
        """Why these inputs are outside what the kernel was compiled for (static facts only: no data is read), or
        None. The binding checks the same and the index values again at run time."""
        sig = self.kop.signature
        want_dtype = _DTYPES[sig.get("VALUE_DTYPE", "float32")]
        L, P, D = int(sig["L"]), int(sig["P"]), int(sig["D"])
        named = {"value": value, "value_spatial_shapes": spatial_shapes,
                 "value_level_start_index": level_start_index, "sampling_locations": sampling_locations,
                 "attention_weights": attention_weights}
        for n, t in named.items():
            if not isinstance(t, torch.Tensor):
                return f"{n}: expected a tensor, got {type(t).__name__}", TypeError
        for n, t in named.items():
            bad = self.kop.check_device(n, t, value.device)
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
        if self.kop.eager(value, sampling_locations, attention_weights):
            def prepare():
                out = value.new_empty((value.shape[0], sampling_locations.shape[1], value.shape[2] * value.shape[3]))
                return out, [*args, out]

            out = self.direct(prepare)  # refused: the checks below say why (value checks raise again from the op)
            if out is not None:
                return out
        misfit = self.msda_misfit(*args)
        if misfit is not None:
            self.kop.outside(*misfit)
            dt = torch.float64 if value.dtype == torch.float64 else torch.float32
            if self.msda_logits:
                args = (*args[:4], _softmax_lp(attention_weights, dt))
            return msda_reference(*args, dtype=dt).to(value.dtype)
        return self.kop.op(*(t.contiguous() for t in args))

    function = ms_deform_attn

    def call_features(self, args, kwargs):
        value, loc = call_arg(args, kwargs, 0, "value"), call_arg(args, kwargs, 3, "sampling_locations")
        N, S, M, Lq = int(value.shape[0]), int(value.shape[1]), int(value.shape[2]), int(loc.shape[1])
        return {"N": N, "Lq": Lq, "M": M, "S": S}, (True if Lq == S else False,)  # a plain bool under torch.compile

    def spec_features(self, spec):
        S = sum(h * w for h, w in spec["levels"])
        return {"N": spec["N"], "Lq": spec["Lq"], "M": spec["M"], "S": S}, (spec["Lq"] == S,)

