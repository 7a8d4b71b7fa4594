// Shared by the family bindings: wraps a candidate's kernel entry point in a Python extension module.
#pragma once
#include <torch/extension.h>

#include <cstring>

// Creates extension module `name` and lets `define(module)` add its functions. The module definition and its name
// must outlive the module: they are leaked on purpose (one per candidate).
template <typename Define>
PyObject* evo_make_candidate_module(const char* name, const char* doc, Define define) {
  auto* def = new pybind11::module_::module_def();
  std::memset(def, 0, sizeof(*def));
  const char* owned_name = strdup(name);
  try {
    auto m = pybind11::module_::create_extension_module(owned_name, doc, def);
    define(m);
    return m.release().ptr();
  } catch (pybind11::error_already_set& e) {
    e.restore();
    return nullptr;
  }
}
