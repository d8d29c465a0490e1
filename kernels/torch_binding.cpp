// The thin Python binding of kernels/*.cu, built by labkit.cuda through torch.utils.cpp_extension.
// It passes raw device pointers and a stream handle (labkit.cuda checks the tensors first), so it
// needs pybind11 only, not torch's headers: the JIT build stays a few seconds per source.

#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>

extern "C" {
int labkit_tma_gemv_smem_bytes(int block_n, int block_k, int stages, int batch, int swiglu);
int labkit_tma_gemv(const void* x, long long x_stride, const void* w, long long w_stride, const void* residual,
                    void* out, float* partials, int* counters, int batch, int n, int k, int swiglu,
                    const void* norm_w, float norm_eps, float norm_offset, int block_n, int block_k, int stages,
                    int split_k, int max_blocks, int pdl, void* stream, char* err, int err_len);
}

namespace {

template <typename T>
T* ptr(std::uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

void tma_gemv(std::uintptr_t x, long long x_stride, std::uintptr_t w, long long w_stride, std::uintptr_t residual,
              std::uintptr_t out, std::uintptr_t partials, std::uintptr_t counters, int batch, int n, int k,
              bool swiglu, std::uintptr_t norm_w, float norm_eps, float norm_offset, int block_n, int block_k,
              int stages, int split_k, int max_blocks, bool pdl, std::uintptr_t stream) {
  char err[512] = {0};
  if (labkit_tma_gemv(ptr<const void>(x), x_stride, ptr<const void>(w), w_stride, ptr<const void>(residual),
                      ptr<void>(out), ptr<float>(partials), ptr<int>(counters), batch, n, k, swiglu ? 1 : 0,
                      ptr<const void>(norm_w), norm_eps, norm_offset, block_n, block_k, stages, split_k, max_blocks,
                      pdl ? 1 : 0, ptr<void>(stream), err, sizeof(err)) != 0) {
    throw std::runtime_error(err);
  }
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "labkit CUDA kernels (kernels/*.cu)";
  m.def("tma_gemv", &tma_gemv, "y = rmsnorm?(x) W^T (+ residual, or SwiGLU) through a TMA pipeline (see kernels/tma_gemv.cu)");
  m.def("tma_gemv_smem_bytes", &labkit_tma_gemv_smem_bytes, "dynamic shared memory of one block");
}
