// A candidate built as device code only (a cubin), loaded into the current device's primary context through the
// driver API, and what a family launcher needs of it: its kernels by name, the traits it exports, launches.
//
// The driver's entry points come through the runtime (cudaGetDriverEntryPointByVersion, as the TMA encoder does):
// nothing links -lcuda. A kernel exports a trait as `extern "C" __constant__ long long evo_trait_<name>` (see
// templates/cuda/common/launch_traits.cuh.j2); the launcher reads each once, at load. The module is unloaded with
// the last reference to it. Every failure is a std::runtime_error naming what and where (the binding's evo_guard
// turns it into a Python exception).
#pragma once
#ifdef EVO_WITH_CUDA
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

struct EvoDriver {
  CUresult (*module_load_data)(CUmodule*, const void*) = nullptr;
  CUresult (*module_unload)(CUmodule) = nullptr;
  CUresult (*module_get_function)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*module_get_global)(CUdeviceptr*, size_t*, CUmodule, const char*) = nullptr;
  CUresult (*memcpy_dtoh)(void*, CUdeviceptr, size_t) = nullptr;
  CUresult (*launch_kernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                            CUstream, void**, void**) = nullptr;
  CUresult (*func_set_attribute)(CUfunction, CUfunction_attribute, int) = nullptr;
  CUresult (*occupancy)(int*, CUfunction, int, size_t) = nullptr;
  CUresult (*error_string)(CUresult, const char**) = nullptr;
  // launches with attributes (clusters, programmatic dependent launch): optional, a launch needing one fails with
  // CUDA_ERROR_NOT_SUPPORTED where the driver has none
  CUresult (*launch_kernel_ex)(const CUlaunchConfig*, CUfunction, void**, void**) = nullptr;
  CUresult (*occupancy_clusters)(int*, CUfunction, const CUlaunchConfig*) = nullptr;

  static const EvoDriver& get() {
    static const EvoDriver driver = load();
    return driver;
  }

 private:
  template <typename F>
  static void entry(F& slot, const char* name, int version) {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found;
#if CUDART_VERSION >= 12050
    const cudaError_t e = cudaGetDriverEntryPointByVersion(name, &fn, version, cudaEnableDefault, &found);
#else  // before CUDA 12.5: the entry point of the runtime's own driver version
    (void)version;
    const cudaError_t e = cudaGetDriverEntryPoint(name, &fn, cudaEnableDefault, &found);
#endif
    if (e != cudaSuccess || found != cudaDriverEntryPointSuccess || fn == nullptr)
      throw std::runtime_error(std::string("CUDA driver entry point ") + name + " not found (driver too old?)");
    slot = reinterpret_cast<F>(fn);
  }
  template <typename F>
  static void optional_entry(F& slot, const char* name, int version) {
    try {
      entry(slot, name, version);
    } catch (const std::runtime_error&) {
      slot = nullptr;
    }
  }
  static EvoDriver load() {
    EvoDriver d;
    entry(d.module_load_data, "cuModuleLoadData", 2000);
    entry(d.module_unload, "cuModuleUnload", 2000);
    entry(d.module_get_function, "cuModuleGetFunction", 2000);
    entry(d.module_get_global, "cuModuleGetGlobal", 3020);
    entry(d.memcpy_dtoh, "cuMemcpyDtoH", 3020);
    entry(d.launch_kernel, "cuLaunchKernel", 4000);
    entry(d.func_set_attribute, "cuFuncSetAttribute", 9000);
    entry(d.occupancy, "cuOccupancyMaxActiveBlocksPerMultiprocessor", 6050);
    entry(d.error_string, "cuGetErrorString", 6000);
    optional_entry(d.launch_kernel_ex, "cuLaunchKernelEx", 12000);
    optional_entry(d.occupancy_clusters, "cuOccupancyMaxActiveClusters", 11080);
    return d;
  }
};

inline std::string evo_cu_error(CUresult r) {
  const char* text = nullptr;
  if (EvoDriver::get().error_string) EvoDriver::get().error_string(r, &text);
  return std::string(text ? text : "unknown CUDA driver error") + " (" + std::to_string(static_cast<int>(r)) + ")";
}

// One loaded cubin on one device.
class EvoCubin {
 public:
  // `image`: the cubin's bytes; `where`: named in errors (the file it came from).
  EvoCubin(const std::string& image, int device, std::string where) : device_(device), where_(std::move(where)) {
    const EvoDriver& d = EvoDriver::get();
    int was = 0;
    check_rt(cudaGetDevice(&was), "cudaGetDevice");
    check_rt(cudaSetDevice(device), "cudaSetDevice");  // makes the device's primary context current
    check_rt(cudaFree(nullptr), "starting the CUDA context");
    const CUresult r = d.module_load_data(&module_, image.data());
    cudaSetDevice(was);
    if (r != CUDA_SUCCESS) throw std::runtime_error(where_ + ": the cubin does not load: " + evo_cu_error(r));
  }
  ~EvoCubin() {
    if (module_ != nullptr) {
      int was = 0;
      if (cudaGetDevice(&was) == cudaSuccess && cudaSetDevice(device_) == cudaSuccess) {
        EvoDriver::get().module_unload(module_);
        cudaSetDevice(was);
      }
    }
  }
  EvoCubin(const EvoCubin&) = delete;
  EvoCubin& operator=(const EvoCubin&) = delete;

  int device() const { return device_; }

  // A kernel of the module (its extern "C" name); nullptr if `optional` and absent.
  CUfunction function(const char* name, bool optional = false) const {
    CUfunction f = nullptr;
    const CUresult r = EvoDriver::get().module_get_function(&f, module_, name);
    if (r == CUDA_SUCCESS) return f;
    if (optional && r == CUDA_ERROR_NOT_FOUND) return nullptr;
    throw std::runtime_error(where_ + ": kernel " + name + ": " + evo_cu_error(r));
  }

  // The device address of a global variable of the module (its extern "C" name), and its size in bytes.
  CUdeviceptr global(const char* name, size_t& bytes) const {
    CUdeviceptr ptr = 0;
    const CUresult r = EvoDriver::get().module_get_global(&ptr, &bytes, module_, name);
    if (r != CUDA_SUCCESS) throw std::runtime_error(where_ + ": global " + name + ": " + evo_cu_error(r));
    return ptr;
  }

  // The value of trait `name` (extern "C" __constant__ long long evo_trait_<name>).
  int64_t trait(const char* name) const {
    const std::string symbol = std::string("evo_trait_") + name;
    CUdeviceptr ptr = 0;
    size_t bytes = 0;
    const EvoDriver& d = EvoDriver::get();
    CUresult r = d.module_get_global(&ptr, &bytes, module_, symbol.c_str());
    if (r != CUDA_SUCCESS || bytes != sizeof(long long))
      throw std::runtime_error(where_ + ": exports no trait " + symbol + " (long long): " + evo_cu_error(r));
    long long v = 0;
    r = d.memcpy_dtoh(&v, ptr, sizeof(v));
    if (r != CUDA_SUCCESS) throw std::runtime_error(where_ + ": reading " + symbol + ": " + evo_cu_error(r));
    return static_cast<int64_t>(v);
  }

 private:
  static void check_rt(cudaError_t e, const char* what) {
    if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
  }
  CUmodule module_ = nullptr;
  int device_ = 0;
  std::string where_;
};

// One kernel of a loaded cubin: raises its dynamic shared memory limit once, answers occupancy (cached per size),
// launches. Launch failures are returned (CUresult as int, 0 = ok), as an entry point's status is.
class EvoKernel {
 public:
  EvoKernel() = default;
  EvoKernel(std::shared_ptr<const EvoCubin> cubin, CUfunction f) : cubin_(std::move(cubin)), f_(f) {}
  explicit operator bool() const { return f_ != nullptr; }

  // Blocks of `threads` threads and `dyn_bytes` dynamic shared memory resident per SM x the device's SMs.
  int resident_grid(int threads, int dyn_bytes, int& blocks) {
    if (dyn_bytes == cached_bytes_ && cached_blocks_ > 0) {
      blocks = cached_blocks_;
      return 0;
    }
    int rc = allow_dynamic_smem(dyn_bytes);
    if (rc != 0) return rc;
    int sms = 0, per_sm = 0;
    const cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, cubin_->device());
    if (e != cudaSuccess) return static_cast<int>(e);
    const CUresult r = EvoDriver::get().occupancy(&per_sm, f_, threads, static_cast<size_t>(dyn_bytes));
    if (r != CUDA_SUCCESS) return static_cast<int>(r);
    blocks = sms * (per_sm > 0 ? per_sm : 1);
    cached_blocks_ = blocks;
    cached_bytes_ = dyn_bytes;
    return 0;
  }

  // Blocks of `threads` threads and `dyn_bytes` dynamic shared memory one SM holds (0: none fit).
  int blocks_per_sm(int threads, int dyn_bytes, int& per_sm) {
    const int rc = allow_dynamic_smem(dyn_bytes);
    if (rc != 0) return rc;
    return static_cast<int>(EvoDriver::get().occupancy(&per_sm, f_, threads, static_cast<size_t>(dyn_bytes)));
  }

  // Launches with the kernel's one parameter (a struct passed by value) or several (`args`: pointers to each).
  int launch(unsigned grid, unsigned threads, int dyn_bytes, void* stream, void** args) {
    return launch3(grid, 1, 1, threads, dyn_bytes, stream, args);
  }
  int launch3(unsigned gx, unsigned gy, unsigned gz, unsigned threads, int dyn_bytes, void* stream, void** args) {
    const int rc = allow_dynamic_smem(dyn_bytes);
    if (rc != 0) return rc;
    return static_cast<int>(EvoDriver::get().launch_kernel(f_, gx, gy, gz, threads, 1, 1,
                                                           static_cast<unsigned>(dyn_bytes),
                                                           static_cast<CUstream>(stream), args, nullptr));
  }

  // A launch configuration with `attrs` (storage the caller keeps alive until the launch).
  static CUlaunchConfig config(unsigned gx, unsigned gy, unsigned gz, unsigned threads, int dyn_bytes, void* stream,
                               CUlaunchAttribute* attrs, unsigned n_attrs) {
    CUlaunchConfig c;
    std::memset(&c, 0, sizeof(c));
    c.gridDimX = gx;
    c.gridDimY = gy;
    c.gridDimZ = gz;
    c.blockDimX = threads;
    c.blockDimY = 1;
    c.blockDimZ = 1;
    c.sharedMemBytes = static_cast<unsigned>(dyn_bytes);
    c.hStream = static_cast<CUstream>(stream);
    c.attrs = attrs;
    c.numAttrs = n_attrs;
    return c;
  }

  // cuLaunchKernelEx: launches with attributes (clusters, programmatic dependent launch).
  int launch_ex(const CUlaunchConfig& c, void** args) {
    const int rc = allow_dynamic_smem(static_cast<int>(c.sharedMemBytes));
    if (rc != 0) return rc;
    const EvoDriver& d = EvoDriver::get();
    if (d.launch_kernel_ex == nullptr) return static_cast<int>(CUDA_ERROR_NOT_SUPPORTED);
    return static_cast<int>(d.launch_kernel_ex(&c, f_, args, nullptr));
  }

  // Clusters of the configuration's cluster size this kernel the device holds at once (cuOccupancyMaxActiveClusters).
  int max_active_clusters(const CUlaunchConfig& c, int& clusters) {
    const int rc = allow_dynamic_smem(static_cast<int>(c.sharedMemBytes));
    if (rc != 0) return rc;
    const EvoDriver& d = EvoDriver::get();
    if (d.occupancy_clusters == nullptr) return static_cast<int>(CUDA_ERROR_NOT_SUPPORTED);
    return static_cast<int>(d.occupancy_clusters(&clusters, f_, &c));
  }

  // Sets an attribute of the kernel (e.g. non-portable cluster sizes).
  int set_attribute(CUfunction_attribute what, int value) {
    return static_cast<int>(EvoDriver::get().func_set_attribute(f_, what, value));
  }

 private:
  int allow_dynamic_smem(int dyn_bytes) {
    if (dyn_bytes <= raised_to_) return 0;
    const CUresult r = EvoDriver::get().func_set_attribute(f_, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                           dyn_bytes);
    if (r != CUDA_SUCCESS) return static_cast<int>(r);
    raised_to_ = dyn_bytes;
    return 0;
  }
  std::shared_ptr<const EvoCubin> cubin_;  // keeps the module loaded while a kernel of it may launch
  CUfunction f_ = nullptr;
  // Nothing raised yet: without the opt-in, dynamic plus static shared memory must stay within 48 KB, so a kernel
  // with some static shared memory and exactly 48 KB dynamic fits nowhere (occupancy 0). Any dynamic size opts in.
  int raised_to_ = 0;
  int cached_blocks_ = 0, cached_bytes_ = -1;
};

// The bytes of a file (a cubin), or a runtime_error naming it.
inline std::string evo_read_file(const char* path) {
  std::FILE* f = std::fopen(path, "rb");
  if (f == nullptr) throw std::runtime_error(std::string(path) + ": cannot open");
  std::string data;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) data.append(buf, n);
  const bool bad = std::ferror(f) != 0;
  std::fclose(f);
  if (bad) throw std::runtime_error(std::string(path) + ": read error");
  return data;
}
#endif  // EVO_WITH_CUDA
