// Shared by every binding (the shipped families' own and the generated ones): wraps a candidate's kernel entry
// point in a Python extension module, reads the signature the candidate was compiled for ("KEY=VALUE;KEY=VALUE",
// written by the build shim), and parses call arguments with the CPython API.
//
// No C++ exception leaves this file's functions: a function a module exposes runs inside evo_guard, which turns an
// argument error (EVO_CHECK_VALUE / EVO_CHECK_TYPE) into a Python ValueError / TypeError and anything else into a
// RuntimeError. (On some hosts a c10::Error that reaches pybind11's translators kills the process.)
#pragma once
// Light headers on purpose: the binding's build is on the critical path of a search's first candidate and of an
// exported op's first import on a fresh machine. torch/extension.h alone parses for ~12 s, and torch's Python
// bindings (torch/csrc/autograd/python_variable.h, pybind11 underneath) for ~6 s of the remaining ~7.5 s; a tensor
// argument is reached through its public `_cdata` attribute instead (below), scratch memory through c10's allocator.
#include <Python.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>
namespace torch {
using namespace at;  // torch::Tensor, torch::kLong, ... as torch/types.h spells them
}
#ifdef EVO_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <type_traits>
#include <cstring>
#include <exception>
#include <utility>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

using EvoSignature = std::map<std::string, std::string>;

// Messages are built without iostreams (c10::str streams): on a host whose extension builds do not link the C++
// runtime the usual way (the H100 image's g++ wrapper), streaming an integer from an extension segfaults.
inline void evo_append(std::string& s, const char* v) { s += v ? v : "(null)"; }
inline void evo_append(std::string& s, const std::string& v) { s += v; }
inline void evo_append(std::string& s, char v) { s.push_back(v); }
inline void evo_append(std::string& s, bool v) { s += v ? "true" : "false"; }
inline void evo_append(std::string& s, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%g", v);
  s += buf;
}
template <typename T, typename std::enable_if<std::is_integral<T>::value && !std::is_same<T, bool>::value &&
                                                  !std::is_same<T, char>::value, int>::type = 0>
void evo_append(std::string& s, T v) {
  s += std::to_string(v);
}
inline void evo_append(std::string& s, c10::IntArrayRef v) {
  s += "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(v[i]);
  }
  s += "]";
}
inline void evo_append(std::string& s, const c10::Device& d) { s += d.str(); }

template <typename... Pieces>
std::string evo_str(const Pieces&... pieces) {
  std::string s;
  (evo_append(s, pieces), ...);
  return s;
}

// An argument the kernel was not compiled for: which Python exception, and the message. Not a std::exception, so
// nothing but evo_guard catches it by accident.
struct EvoArgError {
  PyObject* kind;
  std::string message;
};

#define EVO_CHECK_VALUE(cond, ...) \
  do {                             \
    if (!(cond)) throw EvoArgError{PyExc_ValueError, evo_str(__VA_ARGS__)}; \
  } while (0)
#define EVO_CHECK_TYPE(cond, ...) \
  do {                            \
    if (!(cond)) throw EvoArgError{PyExc_TypeError, evo_str(__VA_ARGS__)}; \
  } while (0)

// Runs `body` (returns a new reference, or nullptr with a Python error set); every C++ exception becomes a Python
// one here.
template <typename Body>
PyObject* evo_guard(Body body) {
  try {
    return body();
  } catch (const EvoArgError& e) {
    PyErr_SetString(e.kind, e.message.c_str());
  } catch (const c10::Error& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError, "unknown C++ exception in the kernel binding");
  }
  return nullptr;
}

inline EvoSignature evo_parse_signature(const char* text) {
  EvoSignature sig;
  std::string s(text ? text : "");
  size_t start = 0;
  while (start < s.size()) {
    size_t end = s.find(';', start);
    if (end == std::string::npos) end = s.size();
    const std::string item = s.substr(start, end - start);
    const size_t eq = item.find('=');
    if (eq != std::string::npos) sig[item.substr(0, eq)] = item.substr(eq + 1);
    start = end + 1;
  }
  return sig;
}

inline int64_t evo_signature_int(const EvoSignature& sig, const char* key) {
  auto it = sig.find(key);
  if (it == sig.end()) throw std::runtime_error(std::string("candidate signature has no ") + key);
  return std::strtoll(it->second.c_str(), nullptr, 10);
}

inline at::ScalarType evo_dtype_named(const std::string& name) {
  if (name == "float32") return at::kFloat;
  if (name == "float16") return at::kHalf;
  if (name == "bfloat16") return at::kBFloat16;
  if (name == "float8_e4m3") return at::ScalarType::Float8_e4m3fn;
  if (name == "float64") return at::kDouble;
  if (name == "int64") return at::kLong;
  if (name == "int32") return at::kInt;
  if (name == "int16") return at::kShort;
  if (name == "int8") return at::kChar;
  if (name == "uint8") return at::kByte;
  if (name == "bool") return at::kBool;
  throw std::runtime_error("candidate signature names an unknown dtype " + name);
}

// The dtype as torch spells it in Python (float16, not Half), for error messages.
inline std::string evo_dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    case at::kDouble: return "float64";
    case at::kLong: return "int64";
    case at::kInt: return "int32";
    case at::kShort: return "int16";
    case at::kChar: return "int8";
    case at::kByte: return "uint8";
    case at::kBool: return "bool";
    case at::ScalarType::Float8_e4m3fn: return "float8_e4m3fn";
    default: return std::string(c10::toString(t));
  }
}

inline at::ScalarType evo_signature_dtype(const EvoSignature& sig, const char* key, const char* fallback) {
  auto it = sig.find(key);
  return evo_dtype_named(it == sig.end() ? std::string(fallback) : it->second);
}

// ---- tensors from Python -------------------------------------------------------------------------------------------
// torch.Tensor (looked up once, with the GIL held): what a tensor argument must be an instance of.
inline bool evo_is_tensor(PyObject* o) {
  static PyObject* tensor_type = []() -> PyObject* {
    PyObject* torch_module = PyImport_ImportModule("torch");
    if (torch_module == nullptr) return nullptr;
    PyObject* type = PyObject_GetAttrString(torch_module, "Tensor");
    Py_DECREF(torch_module);
    return type;  // kept for the life of the process
  }();
  if (tensor_type == nullptr) {
    PyErr_Clear();
    throw std::runtime_error("the kernel binding cannot find torch.Tensor");
  }
  const int is = PyObject_IsInstance(o, tensor_type);
  if (is < 0) PyErr_Clear();
  return is == 1;
}

// The at::Tensor of a torch.Tensor: `_cdata` is the address of its TensorImpl (torch's own, stable attribute; a
// subclass's __torch_function__ sees the access and by default gives the same). The tensor shares the Python
// object's TensorImpl and holds a reference of its own for as long as the call uses it.
inline at::Tensor evo_unpack_tensor(PyObject* o, const std::string& name) {
  static PyObject* key = PyUnicode_InternFromString("_cdata");
  PyObject* address = key ? PyObject_GetAttr(o, key) : nullptr;
  void* impl = address ? PyLong_AsVoidPtr(address) : nullptr;
  Py_XDECREF(address);
  if (impl == nullptr) {
    PyErr_Clear();
    throw EvoArgError{PyExc_TypeError, evo_str(name, ": a tensor whose data this binding cannot reach (no _cdata)")};
  }
  return at::Tensor(c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>::reclaim_copy(
      static_cast<c10::TensorImpl*>(impl)));
}

// ---- call arguments ------------------------------------------------------------------------------------------------
// The arguments of one call (vectorcall: positional, then keywords named in `kwnames`), by declared position.
class EvoArgs {
 public:
  EvoArgs(const char* function, const std::vector<std::string>& names, PyObject* const* args, Py_ssize_t nargs,
          PyObject* kwnames)
      : function_(function), names_(names), given_(names.size(), nullptr) {
    EVO_CHECK_TYPE(static_cast<size_t>(nargs) <= names.size(), function, "() takes ", names.size(),
                   " arguments, got ", nargs);
    for (Py_ssize_t i = 0; i < nargs; ++i) given_[i] = args[i];
    const Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t j = 0; j < nkw; ++j) {
      const char* key = PyUnicode_AsUTF8(PyTuple_GET_ITEM(kwnames, j));
      if (key == nullptr) {
        PyErr_Clear();
        throw EvoArgError{PyExc_TypeError, evo_str(function, "(): keywords must be strings")};
      }
      size_t at = 0;
      while (at < names.size() && names[at] != key) ++at;
      EVO_CHECK_TYPE(at < names.size(), function, "() got an unexpected keyword argument '", key, "'");
      EVO_CHECK_TYPE(given_[at] == nullptr, function, "() got multiple values for argument '", key, "'");
      given_[at] = args[nargs + j];
    }
    for (size_t i = 0; i < names.size(); ++i)
      EVO_CHECK_TYPE(given_[i] != nullptr, function, "() missing argument '", names[i], "'");
  }

  at::Tensor tensor(size_t i) const {
    PyObject* o = given_[i];
    EVO_CHECK_TYPE(evo_is_tensor(o), names_[i], ": expected a tensor, got ", Py_TYPE(o)->tp_name);
    return evo_unpack_tensor(o, names_[i]);
  }
  double real(size_t i) const {
    PyObject* o = given_[i];
    EVO_CHECK_TYPE(!PyBool_Check(o) && (PyFloat_Check(o) || PyLong_Check(o)), names_[i], ": expected a number, got ",
                   Py_TYPE(o)->tp_name);
    const double v = PyFloat_AsDouble(o);
    if (v == -1.0 && PyErr_Occurred()) {
      PyErr_Clear();
      throw EvoArgError{PyExc_ValueError, evo_str(names_[i], ": not representable as a float")};
    }
    return v;
  }
  int64_t integer(size_t i) const {
    PyObject* o = given_[i];
    EVO_CHECK_TYPE(PyLong_Check(o) && !PyBool_Check(o), names_[i], ": expected an int, got ", Py_TYPE(o)->tp_name);
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    EVO_CHECK_VALUE(!overflow && !(v == -1 && PyErr_Occurred()), names_[i], ": does not fit in 64 bits");
    return v;
  }
  bool boolean(size_t i) const {
    PyObject* o = given_[i];
    EVO_CHECK_TYPE(PyBool_Check(o) || PyLong_Check(o), names_[i], ": expected a bool, got ", Py_TYPE(o)->tp_name);
    return PyObject_IsTrue(o) == 1;
  }

 private:
  const char* function_;
  const std::vector<std::string>& names_;
  std::vector<PyObject*> given_;
};

// A function of a candidate module: its name, argument names, doc, and the body run (inside evo_guard) per call.
template <typename State>
struct EvoFunction {
  std::string name;
  std::vector<std::string> args;
  std::string doc;
  PyObject* (*body)(State& state, const EvoArgs& args);
};

template <typename State>
struct EvoBound {
  std::shared_ptr<State> state;
  EvoFunction<State> function;
};

template <typename State>
PyObject* evo_vectorcall(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  auto* bound = static_cast<EvoBound<State>*>(PyCapsule_GetPointer(self, "evoengineer.function"));
  if (bound == nullptr) return nullptr;
  return evo_guard([&]() -> PyObject* {
    const EvoArgs parsed(bound->function.name.c_str(), bound->function.args, args, nargs, kwnames);
    return bound->function.body(*bound->state, parsed);
  });
}

// Adds `function` to `module`; it holds `state` for as long as the function object lives. The method definition is
// leaked on purpose (a few per candidate module, and a module is never unloaded).
template <typename State>
void evo_add_function(PyObject* module, std::shared_ptr<State> state, EvoFunction<State> function) {
  auto* bound = new EvoBound<State>{std::move(state), std::move(function)};
  PyObject* capsule = PyCapsule_New(bound, "evoengineer.function", [](PyObject* c) {
    delete static_cast<EvoBound<State>*>(PyCapsule_GetPointer(c, "evoengineer.function"));
  });
  if (capsule == nullptr) throw std::runtime_error("cannot make a function capsule");
  auto* def = new PyMethodDef{strdup(bound->function.name.c_str()),
                              reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(&evo_vectorcall<State>)),
                              METH_FASTCALL | METH_KEYWORDS, strdup(bound->function.doc.c_str())};
  PyObject* fn = PyCFunction_NewEx(def, capsule, nullptr);
  Py_DECREF(capsule);
  if (fn == nullptr || PyModule_AddObject(module, def->ml_name, fn) != 0) {
    Py_XDECREF(fn);
    throw std::runtime_error("cannot add function " + bound->function.name);
  }
}

// Creates extension module `name` (with `signature` as a dict attribute) and lets `define(module)` add its
// functions (evo_add_function). The module definition and its name must outlive the module: they are leaked on
// purpose (one per candidate). Returns nullptr with ImportError set when anything fails.
template <typename Define>
PyObject* evo_make_candidate_module(const char* name, const char* doc, const char* signature, Define define) {
  PyObject* result = evo_guard([&]() -> PyObject* {
    auto* def = new PyModuleDef{PyModuleDef_HEAD_INIT, strdup(name), strdup(doc), -1, nullptr,
                                nullptr, nullptr, nullptr, nullptr};
    PyObject* m = PyModule_Create(def);
    if (m == nullptr) return nullptr;
    PyObject* sig = PyDict_New();
    for (const auto& kv : evo_parse_signature(signature)) {
      PyObject* v = PyUnicode_FromString(kv.second.c_str());
      PyDict_SetItemString(sig, kv.first.c_str(), v);
      Py_XDECREF(v);
    }
    if (PyModule_AddObject(m, "signature", sig) != 0) {
      Py_DECREF(sig);
      Py_DECREF(m);
      return nullptr;
    }
    try {
      define(m);
    } catch (...) {
      Py_DECREF(m);
      throw;
    }
    return m;
  });
  if (result == nullptr && PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_ImportError)) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject* text = value ? PyObject_Str(value) : nullptr;
    PyErr_SetString(PyExc_ImportError, text ? PyUnicode_AsUTF8(text) : "cannot create the candidate module");
    Py_XDECREF(text);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
  }
  return result;
}

inline PyObject* evo_return_int(int64_t v) { return PyLong_FromLongLong(v); }

// ---- checks --------------------------------------------------------------------------------------------------------
// A tensor argument: its rank, contiguity and device (the first input's), else a ValueError naming it and what it is.
inline void evo_expect_tensor(const torch::Tensor& t, const char* name, int64_t dim, const torch::Device& device) {
  EVO_CHECK_VALUE(t.dim() == dim, name, ": expected ", dim, " dimensions, got ", t.dim(), " (shape ", t.sizes(),
                  ")");
  EVO_CHECK_VALUE(t.is_contiguous(), name, ": must be contiguous (strides ", t.strides(), ")");
  EVO_CHECK_VALUE(t.device() == device, name, ": on ", t.device(), ", expected ", device, " (the device of ",
                  "the first tensor)");
}

// A tensor of the dtype the kernel was compiled for, else a TypeError naming it, both dtypes and the signature.
inline void evo_expect_dtype(const torch::Tensor& t, const char* name, at::ScalarType want, const std::string& sig) {
  EVO_CHECK_TYPE(t.scalar_type() == want, name, ": dtype ", evo_dtype_name(t.scalar_type()),
                 ", but this kernel was compiled for ", evo_dtype_name(want), " (", sig, ")");
}

// The first tensor argument is on the kind of device this build runs on (CUDA build: a CUDA device; else the CPU).
inline void evo_expect_build_device(const torch::Tensor& t, const char* name) {
#ifdef EVO_WITH_CUDA
  EVO_CHECK_VALUE(t.device().is_cuda(), name, ": on ", t.device(), ", this CUDA kernel needs CUDA tensors");
#else
  EVO_CHECK_VALUE(t.device().is_cpu(), name, ": on ", t.device(), ", this CPU kernel needs CPU tensors");
#endif
}

// Runs `call(stream)` (the kernel entry point) on `device` and its current stream (nullptr on the CPU), without the
// GIL; returns the entry point's status.
template <typename Call>
int evo_call_on_stream(const torch::Device& device, Call call) {
  void* stream = nullptr;
#ifdef EVO_WITH_CUDA
  const c10::cuda::CUDAGuard guard(device);
  stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
#else
  (void)device;
#endif
  PyThreadState* saved = PyEval_SaveThread();
  int status;
  try {
    status = call(stream);
  } catch (...) {
    PyEval_RestoreThread(saved);
    throw;
  }
  PyEval_RestoreThread(saved);
  return status;
}

// Whether the current CUDA stream is being captured into a graph (nothing may be read back then).
inline bool evo_capturing(const torch::Tensor& t) {
#ifdef EVO_WITH_CUDA
  return t.is_cuda() && c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
#else
  (void)t;
  return false;
#endif
}

// Index tensors found valid: the same tensor object, unmodified since (version counter), against the same limits,
// is not read back again (on a GPU that read is a synchronization). Several are kept: callers alternate index
// tensors (a model's layers, the timing loop's input sets), and with one kept every call of such a loop would read
// back. A weak reference keeps a freed tensor's address from being taken by another while it is remembered.
struct EvoCheckedTensor {
  static constexpr size_t kKeep = 16;
  struct Entry {
    c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> impl;
    int64_t version;
    std::vector<int64_t> bounds;  // the limits it was checked against
  };
  std::vector<Entry> entries;
  size_t next = 0;  // the entry replaced next once kKeep are kept

  bool same_as(const torch::Tensor& t, const std::vector<int64_t>& now) const {
    for (const auto& e : entries) {
      if (e.bounds != now || e.version != static_cast<int64_t>(t._version())) continue;
      auto alive = e.impl.lock();
      if (alive.defined() && alive.get() == t.unsafeGetTensorImpl()) return true;
    }
    return false;
  }
  void remember(const torch::Tensor& t, const std::vector<int64_t>& now) {
    Entry e{c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>(t.getIntrusivePtr()),
            static_cast<int64_t>(t._version()), now};
    if (entries.size() < kKeep) {
      entries.push_back(std::move(e));
    } else {
      entries[next] = std::move(e);
      next = (next + 1) % kKeep;
    }
  }
};

// The signature of an attention kernel (sdpa, decode families): HEAD_DIM, Q_DTYPE (default float16), KV_DTYPE
// (default Q_DTYPE), OUT_DTYPE (default Q_DTYPE; an FP8 Q writes float16 or bfloat16).
struct EvoAttentionSignature {
  int64_t head_dim = 0;
  at::ScalarType q_dtype = at::kHalf, kv_dtype = at::kHalf, out_dtype = at::kHalf;
  std::string text;
};
inline void evo_read_attention_signature(EvoAttentionSignature& sig) {
  const auto parsed = evo_parse_signature(sig.text.c_str());
  sig.head_dim = evo_signature_int(parsed, "HEAD_DIM");
  const char* q_name = parsed.count("Q_DTYPE") ? parsed.at("Q_DTYPE").c_str() : "float16";
  sig.q_dtype = evo_signature_dtype(parsed, "Q_DTYPE", "float16");
  sig.kv_dtype = evo_signature_dtype(parsed, "KV_DTYPE", q_name);
  sig.out_dtype = evo_signature_dtype(parsed, "OUT_DTYPE", q_name);
}

// What every attention binding checks first: q's device is the kind this build runs on; q, k, v, out are 4-D and
// k_scale, v_scale 1-D, all contiguous on q's device; q has the compiled Q dtype, out the compiled output dtype.
inline void evo_expect_attention_tensors(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                         const torch::Tensor& k_scale, const torch::Tensor& v_scale,
                                         const torch::Tensor& out, at::ScalarType q_dtype, at::ScalarType out_dtype,
                                         const std::string& sig) {
  const auto device = q.device();
  evo_expect_build_device(q, "q");
  evo_expect_tensor(q, "q", 4, device);
  evo_expect_tensor(k, "k", 4, device);
  evo_expect_tensor(v, "v", 4, device);
  evo_expect_tensor(out, "out", 4, device);
  evo_expect_tensor(k_scale, "k_scale", 1, device);
  evo_expect_tensor(v_scale, "v_scale", 1, device);
  evo_expect_dtype(q, "q", q_dtype, sig);
  EVO_CHECK_TYPE(out.scalar_type() == out_dtype, "out: dtype ", evo_dtype_name(out.scalar_type()),
                 ", but this kernel writes ", evo_dtype_name(out_dtype), " (", sig, ")");
}

// Calls `call(workspace, &bytes)` (an entry point's workspace protocol: with workspace == nullptr a kernel that
// needs scratch memory launches nothing, writes the bytes it needs and returns kEvoNeedWorkspace); allocates them
// from torch's allocator of `like`'s device (CUDA: the caching allocator, on the current stream, inside a graph
// capture from the graph's pool, as torch.empty would; stream-ordered: reuse is ordered after the kernel) and calls
// again. Call it with the device current (evo_call_on_stream sets it).
constexpr int kEvoNeedWorkspace = 6;
template <typename Call>
int evo_with_workspace(const torch::Tensor& like, Call call) {
  int64_t bytes = 0;
  int status = call(nullptr, &bytes);
  if (status == kEvoNeedWorkspace && bytes > 0) {
    c10::Allocator* allocator = c10::GetAllocator(like.device().type());
    if (allocator == nullptr) throw std::runtime_error("no allocator for the device of the kernel's tensors");
    const c10::DataPtr workspace = allocator->allocate(static_cast<size_t>(bytes));
    status = call(workspace.get(), &bytes);
  }
  return status;
}

// ---- checks of a declared call (the generated bindings) ------------------------------------------------------------
// A declared tensor: its device (the first tensor's), dtype, rank and contiguity.
inline void evo_generic_tensor(const at::Tensor& t, const char* name, int64_t dim, const char* dims,
                               at::ScalarType dtype, const torch::Device& device, const std::string& sig,
                               bool strided, bool output) {
  EVO_CHECK_VALUE(t.device() == device, name, ": on ", t.device(), ", expected ", device,
                  " (the device of the first tensor)");
  EVO_CHECK_TYPE(t.scalar_type() == dtype, name, ": dtype ", evo_dtype_name(t.scalar_type()),
                 ", but this kernel was compiled for ", evo_dtype_name(dtype), " (", sig, ")");
  EVO_CHECK_VALUE(t.dim() == dim, name, ": expected ", dim, " dimensions ", dims, ", got ", t.dim(), " (shape ",
                  t.sizes(), ")");
  if (strided) {  // any strides; an output the kernel writes must not overlap itself (an expanded tensor)
    EVO_CHECK_VALUE(!output || t.is_non_overlapping_and_dense(), name, ": its elements overlap or leave gaps (strides ",
                    t.strides(), "); an output must be dense");
    return;
  }
  EVO_CHECK_VALUE(t.is_contiguous(), name, ": must be contiguous (strides ", t.strides(), ")");
}

// A declared tensor's data pointer is a multiple of `align` bytes (a kernel's vector loads need it).
inline void evo_generic_align(const at::Tensor& t, const char* name, int64_t align) {
  const auto address = reinterpret_cast<uintptr_t>(t.data_ptr());
  EVO_CHECK_VALUE(t.numel() == 0 || address % static_cast<uintptr_t>(align) == 0, name, ": data at byte offset ",
                  static_cast<int64_t>(address % static_cast<uintptr_t>(align)), " from a ", align,
                  "-byte boundary; this kernel needs ", align, "-byte aligned data (a view at an offset? pass a copy)");
}

// A tensor the kernel writes shares no byte with another argument (an in-place update through two arguments, or
// an output that is also read, gives whatever order the kernel's threads happen to run in).
inline std::pair<uintptr_t, uintptr_t> evo_byte_span(const at::Tensor& t) {
  const auto start = reinterpret_cast<uintptr_t>(t.data_ptr());
  int64_t last = 0;  // element offset of the furthest element (strides are non-negative for declared tensors)
  for (int64_t i = 0; i < t.dim(); ++i) last += (t.size(i) - 1) * std::max<int64_t>(t.stride(i), 0);
  return {start, start + static_cast<uintptr_t>((last + 1) * t.element_size())};
}

inline void evo_generic_disjoint(const at::Tensor& written, const char* name, const at::Tensor& other,
                                 const char* other_name) {
  if (written.numel() == 0 || other.numel() == 0) return;
  const auto a = evo_byte_span(written), b = evo_byte_span(other);
  EVO_CHECK_VALUE(a.second <= b.first || b.second <= a.first, name, " and ", other_name,
                  " share memory; a tensor the kernel writes must not overlap another argument (pass a copy)");
}

// Dimension `i` of a declared tensor against the size it must have (`what`: its symbol or product; `from`: the
// argument that gave the symbol its value, if any).
inline void evo_generic_size(const at::Tensor& t, const char* name, int64_t i, const char* what, int64_t want,
                             const char* from) {
  if (t.size(i) == want) return;
  if (from[0] != '\0')
    throw EvoArgError{PyExc_ValueError, evo_str(name, ": size ", i, " (", what, ", from ", from, ") is ", t.size(i),
                                                 ", expected ", want, " (shape ", t.sizes(), ")")};
  throw EvoArgError{PyExc_ValueError, evo_str(name, ": size ", i, " (", what, ") is ", t.size(i), ", expected ",
                                               want, " (shape ", t.sizes(), ")")};
}

// Dimension `i` against a size the kernel was compiled for.
inline void evo_generic_fixed(const at::Tensor& t, const char* name, int64_t i, const char* symbol, int64_t want,
                              const std::string& sig) {
  EVO_CHECK_VALUE(t.size(i) == want, name, ": ", symbol, " = ", t.size(i), " (size ", i,
                  "), but this kernel was compiled for ", symbol, " = ", want, " (", sig, ")");
}

// Every value of an integer tensor in [lo, hi): read back once per unchanged tensor (a synchronization on a GPU),
// never during CUDA graph capture (the values were, or will be, checked on an eager call).
inline void evo_generic_bounds(EvoCheckedTensor& seen, const at::Tensor& t, const char* name, int64_t lo, int64_t hi,
                               const char* lo_text, const char* hi_text) {
  const std::vector<int64_t> limits{lo, hi};
  if (t.numel() == 0 || seen.same_as(t, limits) || evo_capturing(t)) return;
  const at::Tensor host = t.to(at::kCPU, at::kLong).contiguous();
  const int64_t* v = host.data_ptr<int64_t>();
  for (int64_t i = 0; i < host.numel(); ++i)
    EVO_CHECK_VALUE(v[i] >= lo && v[i] < hi, name, ": element ", i, " (flat) is ", v[i], ", outside [", lo_text, ", ",
                    hi_text, ") = [", lo, ", ", hi, ")");
  seen.remember(t, limits);
}
