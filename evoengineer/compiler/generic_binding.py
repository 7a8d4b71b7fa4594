"""The binding of a declared call (evoengineer.family.Signature), generated as C++ and built once per signature and
toolchain like a family's own binding.

The generated module's ``forward(*args)`` takes the declared arguments in order (keywords by name), checks each
before the launch (a tensor: device kind and that every tensor shares the first one's device, dtype, rank,
contiguity (unless declared strided: then a written tensor must not overlap itself), that a written tensor (output or
inout) shares no memory with another argument, each dimension against its symbol, fixed size or product; an integer tensor with bounds: its values, read
once per unchanged tensor and not during CUDA graph capture; a scalar: its Python type), raising ValueError/TypeError
naming the argument and both values; then calls the entry point on the current stream without the GIL (with the
workspace protocol when declared), raises RuntimeError on a non-zero status and returns 0. No C++ exception leaves
it (candidate_module.h).
"""

from __future__ import annotations

import re
from typing import Any

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_AT_DTYPES = {"float32": "at::kFloat", "float16": "at::kHalf", "bfloat16": "at::kBFloat16",
              "float8_e4m3": "at::ScalarType::Float8_e4m3fn", "float64": "at::kDouble", "int64": "at::kLong",
              "int32": "at::kInt", "int16": "at::kShort", "int8": "at::kChar", "uint8": "at::kByte", "bool": "at::kBool"}
_SCALAR = {"float32": ("float", "real"), "float64": ("double", "real"), "int64": ("int64_t", "integer"),
           "int32": ("int32_t", "integer"), "bool": ("int", "boolean")}


def _cstr(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _factors(d: Any) -> list[Any]:
    if isinstance(d, int):
        return [d]
    return [int(f) if f.strip().isdigit() else f.strip() for f in str(d).split("*")]


def generate_binding(signature: Any, entry: str, doc: str) -> str:
    """C++ source of the binding for `signature` (a Signature) calling `entry`."""
    if not _IDENT.fullmatch(entry):
        raise ValueError(f"entry {entry!r}: not a C identifier")
    call = signature.to_json()
    args, fixed, order = call["args"], call["fixed"], call["sizes"]
    tensors = [a for a in args if a["kind"] == "tensor"]
    first = next(a for a in tensors if not a["output"])
    writes = [a for a in tensors if a["output"] or a.get("inout")]
    params = [("void*" if a in writes else "const void*") for a in tensors]
    params += ["const int64_t*" for a in tensors if a.get("strided")]
    params += ["int64_t"] * len(order)
    params += [_SCALAR[a["dtype"]][0] for a in args if a["kind"] == "scalar"]
    if call["workspace"]:
        params += ["void*", "int64_t*"]
    params.append("void*")

    body: list[str] = []
    emit = body.append
    index = {a["name"]: i for i, a in enumerate(args)}
    for a in tensors:
        emit(f"  const at::Tensor& t_{a['name']} = a.tensor({index[a['name']]});")
    emit(f"  evo_expect_build_device(t_{first['name']}, {_cstr(first['name'])});")
    emit(f"  const auto device = t_{first['name']}.device();")
    bound: dict[str, str] = {}
    for k, v in fixed.items():
        emit(f"  const int64_t s_{k} = {int(v)};  // fixed by the signature")
    checks_after: list[str] = []
    for a in tensors:
        n, dims = a["name"], a["dims"]
        shown = "[" + ", ".join(str(d) for d in dims) + "]"
        emit(f"  evo_generic_tensor(t_{n}, {_cstr(n)}, {len(dims)}, {_cstr(shown)}, {_AT_DTYPES[a['dtype']]}, "
             f"device, st.signature, {'true' if a.get('strided') else 'false'}, "
             f"{'true' if a in writes else 'false'});")
        if a.get("align"):
            emit(f"  evo_generic_align(t_{n}, {_cstr(n)}, {int(a['align'])});")
        for i, d in enumerate(dims):
            if isinstance(d, str) and _IDENT.fullmatch(d) and d not in fixed and d not in bound and not a["output"]:
                bound[d] = n
                emit(f"  const int64_t s_{d} = t_{n}.size({i});")
                continue
            factors = _factors(d)
            expr = " * ".join(str(f) if isinstance(f, int) else f"s_{f}" for f in factors)
            if isinstance(d, str) and _IDENT.fullmatch(d) and d in fixed:
                line = (f"  evo_generic_fixed(t_{n}, {_cstr(n)}, {i}, {_cstr(d)}, s_{d}, st.signature);")
            else:
                src = bound.get(d, "") if isinstance(d, str) else ""
                line = (f"  evo_generic_size(t_{n}, {_cstr(n)}, {i}, {_cstr(str(d))}, {expr}, "
                        f"{_cstr(src)});")
            if all(isinstance(f, int) or f in bound or f in fixed for f in factors):
                emit(line)
            else:
                checks_after.append(line)
    body.extend(checks_after)
    scalars = [a for a in args if a["kind"] == "scalar"]
    for a in scalars:
        ctype, getter = _SCALAR[a["dtype"]]
        emit(f"  const {ctype} v_{a['name']} = static_cast<{ctype}>(a.{getter}({index[a['name']]}));")
    bounded = [a for a in tensors if a.get("bounds")]
    for k, a in enumerate(bounded):
        lo, hi = (" * ".join(str(f) if isinstance(f, int) else f"s_{f}" for f in _factors(b)) for b in a["bounds"])
        emit(f"  evo_generic_bounds(st.checked[{k}], t_{a['name']}, {_cstr(a['name'])}, {lo}, {hi}, "
             f"{_cstr(str(a['bounds'][0]))}, {_cstr(str(a['bounds'][1]))});")
    for w in writes:  # a written tensor shares memory with no other argument
        for a in tensors:
            if a is not w and not (a in writes and tensors.index(a) < tensors.index(w)):
                emit(f"  evo_generic_disjoint(t_{w['name']}, {_cstr(w['name'])}, t_{a['name']}, {_cstr(a['name'])});")
    empty = " && ".join(f"t_{w['name']}.numel() == 0" for w in writes)
    emit(f"  if ({empty}) return evo_return_int(0);  // nothing to write")
    call_args = [f"t_{a['name']}.data_ptr()" for a in tensors]
    call_args += [f"t_{a['name']}.strides().data()" for a in tensors if a.get("strided")]
    call_args += [f"s_{s}" for s in order]
    call_args += [f"v_{a['name']}" for a in scalars]
    launch = call.get("launch")
    if launch:
        body.extend(_launch_call(launch, tensors, writes, order, scalars))
    elif call["workspace"]:
        emit("  const int status = evo_call_on_stream(device, [&](void* stream) {")
        emit(f"    return evo_with_workspace(t_{first['name']}, [&](void* workspace, int64_t* bytes) {{")
        emit(f"      return st.fn({', '.join(call_args + ['workspace', 'bytes', 'stream'])});")
        emit("    });")
        emit("  });")
    else:
        emit("  const int status = evo_call_on_stream(device, [&](void* stream) {")
        emit(f"    return st.fn({', '.join(call_args + ['stream'])});")
        emit("  });")
    if not launch:
        emit("  if (status != 0) throw EvoArgError{PyExc_RuntimeError, evo_str(\"kernel returned status \", status)};")
        emit("  return evo_return_int(0);")

    names = ", ".join(_cstr(a["name"]) for a in args)
    fn_doc = (f"Run the candidate kernel ({', '.join(a['name'] for a in args)}); returns 0, raises RuntimeError on "
              "a non-zero status. Inputs it was not compiled for raise ValueError / TypeError.")
    return f"""// Generated by EvoEngineer from a declared call signature: do not edit (it is rebuilt when the signature
// changes). {doc}

#include "candidate_module.h"
{_LAUNCH_INCLUDE if launch else ""}
#include <memory>
#include <string>
#include <vector>

namespace {{

using EntryFn = int (*)({', '.join(params)});

struct State {{
  EntryFn fn = nullptr;
  std::string signature;
  EvoCheckedTensor checked[{max(1, len(bounded))}];
{_LAUNCH_STATE if launch else ""}}};

PyObject* forward(State& st, const EvoArgs& a) {{
{chr(10).join(body)}
}}

}}  // namespace

extern "C" __attribute__((visibility("default"))) PyObject* evo_binding_make_module(const char* name, void* entry,
                                                                                    const char* signature) {{
  return evo_make_candidate_module(name, {_cstr(doc)}, signature, [&](PyObject* m) {{
    auto st = std::make_shared<State>();
    st->fn = reinterpret_cast<EntryFn>(entry);
    st->signature = signature;
    evo_add_function<State>(m, st, {{"forward", {{{names}}}, {_cstr(fn_doc)}, &forward}});
  }});
}}
{_load_cubin(entry, names, fn_doc, doc) if launch else ""}"""


# ---- device code the binding launches (Signature.launch) ---------------------------------------------------------
#: the launch traits a launched kernel exports (EVO_TRAIT), each read once when its cubin is loaded
LAUNCH_TRAITS = ("threads", "smem_bytes", "items_per_block", "persistent")

_LAUNCH_INCLUDE = """#ifdef EVO_WITH_CUDA
#include "cubin_module.h"
#endif
"""

_LAUNCH_STATE = """#ifdef EVO_WITH_CUDA
  // the loaded cubin, its kernel and the launch traits it exports (read once, at load)
  std::shared_ptr<const EvoCubin> module;
  EvoKernel kernel;
  int64_t threads = 0, smem_bytes = 0, items_per_block = 1, persistent = 0;
#endif
"""


def _launch_call(launch: dict[str, Any], tensors: list[dict], writes: list[dict], order: list[str],
                 scalars: list[dict]) -> list[str]:
    """The forward's launch of a device-only candidate: a 1-D grid over the declared items (capped at the resident
    blocks when the kernel is persistent), the kernel's arguments as the entry point's without the stream."""
    items = " * ".join(str(f) if isinstance(f, int) else f"s_{f}" for f in _factors(launch["items"]))
    out = ["#ifdef EVO_WITH_CUDA",
           "  EVO_CHECK_VALUE(st.kernel, \"this module has no loaded kernel (a device-only build loads its cubin)\");",
           f"  EVO_CHECK_VALUE(device.index() == st.module->device(), {_cstr(tensors[0]['name'])}, \": on \", device, "
           "\", but this kernel was loaded on cuda:\", st.module->device());",
           f"  const int64_t items = {items};",
           "  const int status = evo_call_on_stream(device, [&](void* stream) -> int {",
           "    int64_t grid = (items + st.items_per_block - 1) / st.items_per_block;",
           "    if (st.persistent) {",
           "      int cap = 0;",
           "      const int rc = st.kernel.resident_grid(static_cast<int>(st.threads), static_cast<int>(st.smem_bytes), "
           "cap);",
           "      if (rc != 0) return rc;",
           "      if (cap < 1) return 5;  // no block fits on an SM",
           "      if (grid > cap) grid = cap;",
           "    }",
           "    if (grid <= 0) return 0;",
           "    if (grid > 2147483647) return 3;  // more blocks than a grid holds"]
    refs = []
    for a in tensors:
        const = "" if a in writes else "const "
        out.append(f"    {const}void* k_{a['name']} = t_{a['name']}.data_ptr();")
        refs.append(f"k_{a['name']}")
    for size in order:
        out.append(f"    int64_t k_s_{size} = s_{size};")
        refs.append(f"k_s_{size}")
    for a in scalars:
        ctype = _SCALAR[a["dtype"]][0]
        out.append(f"    {ctype} k_v_{a['name']} = v_{a['name']};")
        refs.append(f"k_v_{a['name']}")
    out.append(f"    void* args[] = {{{', '.join(f'(void*)&{r}' for r in refs)}}};")
    out += ["    return st.kernel.launch(static_cast<unsigned>(grid), static_cast<unsigned>(st.threads), "
            "static_cast<int>(st.smem_bytes), stream, args);",
            "  });",
            "  if (status != 0) throw EvoArgError{PyExc_RuntimeError, evo_str(\"kernel launch returned status \", "
            "status)};",
            "  return evo_return_int(0);",
            "#else",
            "  (void)st;",
            "  throw EvoArgError{PyExc_RuntimeError, \"a launched kernel needs a CUDA build of its binding\"};",
            "#endif"]
    return out


def _load_cubin(entry: str, names: str, fn_doc: str, doc: str) -> str:
    """evo_binding_load_cubin of a launched kernel: the cubin loaded on a device, its kernel found by name, its
    launch traits read and checked (ImportError naming the file and what is wrong)."""
    kernel = _cstr(entry)
    traits = "\n".join(f'    st->{t} = st->module->trait("{t}");' for t in LAUNCH_TRAITS)
    return f"""
#ifdef EVO_WITH_CUDA
// A device-only candidate (its cubin at `path`, built for `signature`) loaded on CUDA device `device`, as a module
// with the same forward(); ImportError naming the file when it does not load (called through ctypes.PyDLL).
extern "C" __attribute__((visibility("default"))) PyObject* evo_binding_load_cubin(const char* name, const char* path,
                                                                                   int device, const char* signature) {{
  return evo_make_candidate_module(name, {_cstr(doc + " (device-only build)")}, signature, [&](PyObject* m) {{
    auto st = std::make_shared<State>();
    st->module = std::make_shared<const EvoCubin>(evo_read_file(path), device, path);
    st->kernel = EvoKernel(st->module, st->module->function({kernel}));
{traits}
    if (st->threads < 1 || st->threads > 1024 || st->smem_bytes < 0 || st->smem_bytes > (1 << 30) ||
        st->items_per_block < 1)
      throw std::runtime_error(std::string(path) + ": launch traits out of range: threads " +
                               std::to_string(st->threads) + ", smem_bytes " + std::to_string(st->smem_bytes) +
                               ", items_per_block " + std::to_string(st->items_per_block));
    st->signature = signature;
    evo_add_function<State>(m, st, {{"forward", {{{names}}}, {_cstr(fn_doc)}, &forward}});
  }});
}}
#endif
"""
