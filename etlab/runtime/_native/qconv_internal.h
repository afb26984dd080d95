// Internal declarations shared by the int8 kernel sources (qconv.cpp, qconv_gemm.cpp, qconv_depthwise.cpp,
// qconv_eltwise.cpp): the ISA choice, the requantization helpers, argument checks and the Bound wrapper. They
// are split into several files only to keep each one small; this header is not part of any public interface.
#pragma once

#include "qconv.h"
#include "conv.h"  // OutputCache

#include <ATen/ATen.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace etlab_native {
// hidden, as pybind11 is: these names are internal to the module
namespace int8 __attribute__((visibility("hidden"))) {

namespace py = pybind11;

#define ETLAB_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
#define ETLAB_AVX2 __attribute__((target("avx2,fma")))

enum Isa : int { kScalar = 0, kAvx2 = 1, kVnni = 2 };

int detected_isa();

// The kernel form for an object made now: the widest the CPU has, capped by ETLAB_INT8_ISA and `requested`.
int choose_isa(int64_t requested);

inline int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

inline int32_t load4(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

inline int32_t load_tail(const uint8_t* p, int64_t n) {  // 1 <= n < 4 bytes, the rest zero
  uint32_t v = p[0];
  if (n > 1) v |= uint32_t(p[1]) << 8;
  if (n > 2) v |= uint32_t(p[2]) << 16;
  return int32_t(v);
}

// Output bounds of one call, in the shifted (uint8) form, and what requantization needs of them.
struct Bounds {
  int32_t zp, lo, hi;
  float fmin() const { return float(lo - zp); }
  float fmax() const { return float(hi - zp); }
};

inline uint8_t requant_scalar_f(float f, const Bounds& b) {
  f = std::min(std::max(f, b.fmin()), b.fmax());
  return uint8_t(int32_t(std::nearbyint(f)) + b.zp);
}

inline uint8_t requant_scalar(int32_t acc, float scale, const Bounds& b) {
  return requant_scalar_f(float(acc) * scale, b);
}

// Per-output-channel epilogue data, padded to a multiple of 16 channels: bias with the input zero point's
// share folded in, and the requantization scale.
struct Epilogue {
  std::vector<int32_t> bias;
  std::vector<float> scale;
};

ETLAB_VNNI inline __m128i requant16_vnni(__m512i acc, const float* scale, __m512 fmin, __m512 fmax, __m512i zp) {
  __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(acc), _mm512_loadu_ps(scale));
  f = _mm512_min_ps(_mm512_max_ps(f, fmin), fmax);
  return _mm512_cvtepi32_epi8(_mm512_add_epi32(_mm512_cvtps_epi32(f), zp));
}

ETLAB_VNNI inline void store16_vnni(uint8_t* out, __m128i v, int64_t valid) {
  if (valid >= 16)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), v);
  else
    _mm_mask_storeu_epi8(out, __mmask16((1u << valid) - 1), v);
}

ETLAB_AVX2 inline void store8_avx2(uint8_t* out, __m256i acc, const float* scale, const Bounds& bd, int64_t valid) {
  __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(acc), _mm256_loadu_ps(scale));
  f = _mm256_min_ps(_mm256_max_ps(f, _mm256_set1_ps(bd.fmin())), _mm256_set1_ps(bd.fmax()));
  __m256i i = _mm256_add_epi32(_mm256_cvtps_epi32(f), _mm256_set1_epi32(bd.zp));
  __m128i p16 = _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
  __m128i p8 = _mm_packus_epi16(p16, p16);
  if (valid >= 8) {
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out), p8);
  } else if (valid > 0) {
    alignas(16) uint8_t tmp[16];
    _mm_store_si128(reinterpret_cast<__m128i*>(tmp), p8);
    std::memcpy(out, tmp, size_t(valid));
  }
}

// ---------------------------------------------------------------------------------------------------
// Shared argument checks and the epilogue made at load
// ---------------------------------------------------------------------------------------------------

void check(bool ok, const std::string& message);

at::Tensor contiguous_u8(const at::Tensor& x, const char* what);

// bias (int32 [N]) with -x_zp * sum_k W[n, k] folded in; scales (float32 [N]); both padded to 16
Epilogue make_epilogue(const at::Tensor& bias, const at::Tensor& scale, const std::vector<int64_t>& wsum, int64_t N,
                       int64_t x_zp);

Bounds make_bounds(int64_t y_zp, int64_t lo, int64_t hi);

struct Geometry {
  int64_t kh, kw, sh, sw, dh, dw, pt, pl, pb, pr;
  int64_t out_h(int64_t h) const { return (h + pt + pb - dh * (kh - 1) - 1) / sh + 1; }
  int64_t out_w(int64_t w) const { return (w + pl + pr - dw * (kw - 1) - 1) / sw + 1; }
};

Geometry make_geometry(int64_t kh, int64_t kw, const std::vector<int64_t>& pads, const std::vector<int64_t>& stride,
                       const std::vector<int64_t>& dilation);

// The input rows of each tap of output pixel (oy, ox): a pointer into x's image, or to `zeros` (the input
// zero point, i.e. the value 0) where the tap falls in the padding.
inline void tap_pointers(const Geometry& g, const uint8_t* image, int64_t H, int64_t W, int64_t C, int64_t oy,
                         int64_t ox, const uint8_t* zeros, const uint8_t** ptrs) {
  int64_t t = 0;
  for (int64_t ky = 0; ky < g.kh; ++ky) {
    const int64_t iy = oy * g.sh - g.pt + ky * g.dh;
    for (int64_t kx = 0; kx < g.kw; ++kx, ++t) {
      const int64_t ix = ox * g.sw - g.pl + kx * g.dw;
      ptrs[t] = (iy >= 0 && iy < H && ix >= 0 && ix < W) ? image + (iy * W + ix) * C : zeros;
    }
  }
}

// Releases the GIL for calls with this much work or more (multiply-adds or elements); a small call's release and
// re-acquire would cost more than the other threads gain.
constexpr int64_t kReleaseGilWork = int64_t(1) << 17;

struct MaybeReleaseGil {
  explicit MaybeReleaseGil(int64_t work) {
    if (work >= kReleaseGilWork && PyGILState_Check()) release.emplace();  // held: not inside xnn_plan.cpp's loop
  }
  std::optional<py::gil_scoped_release> release;
};

struct QConv2d;  // qconv_gemm.cpp

// A kernel with output bounds of its own (a following clamp fused: a clamp of a clamp is one clamp), called with
// the input alone; `rows`: a fully connected layer's call. Shares the kernel's packed weights.
template <class Kernel>
struct Bound {
  std::shared_ptr<const Kernel> kernel;
  int64_t lo, hi;
  bool rows = false;

  at::Tensor operator()(const at::Tensor& x) const {
    if constexpr (std::is_same_v<Kernel, QConv2d>) {
      if (rows) return kernel->run_rows(x, lo, hi);
    }
    return kernel->run(x, lo, hi);
  }
  Bound clamped(int64_t lo2, int64_t hi2) const {
    check(0 <= lo2 && lo2 <= hi2 && hi2 <= 255, "bounds must be uint8 values with lo <= hi");
    return Bound{kernel, std::min(std::max(lo, lo2), hi2), std::max(std::min(hi, hi2), lo2), rows};
  }
};

template <class Kernel>
Bound<Kernel> bound(const std::shared_ptr<Kernel>& k, bool rows) {
  return Bound<Kernel>{k, k->bounds().lo, k->bounds().hi, rows};
}

template <class Kernel>
void bind_bound(py::module_& m, const char* name) {
  py::class_<Bound<Kernel>>(m, name)
      .def("__call__", &Bound<Kernel>::operator(), py::arg("x"))
      .def("clamped", &Bound<Kernel>::clamped, py::arg("lo"), py::arg("hi"),
           "The same kernel with its output also clamped to [lo, hi] (uint8 form)")
      .def_readonly("lo", &Bound<Kernel>::lo)
      .def_readonly("hi", &Bound<Kernel>::hi);
}

// Conversions between float32 values and the shifted integers (qconv_eltwise.cpp).
at::Tensor quantize_u8(const at::Tensor& x_in, double inv_scale, int64_t zp, int64_t lo, int64_t hi, int64_t isa);
at::Tensor dequantize_u8(const at::Tensor& q_in, double scale, int64_t zp, int64_t isa);

// A kernel object made in Python as a C++ function (the XNNPACK partition plan, xnn_plan.cpp): an empty function
// when `obj` is not of the file's kind. Each shares the object's packed weights.
using UnaryFn = std::function<at::Tensor(const at::Tensor&)>;
using BinaryFn = std::function<at::Tensor(const at::Tensor&, const at::Tensor&)>;
UnaryFn bound_qconv_fn(py::handle obj);        // BoundQConv2d (qconv_gemm.cpp)
UnaryFn bound_qdepthwise_fn(py::handle obj);   // BoundQDepthwiseConv2d (qconv_depthwise.cpp)
BinaryFn qadd_fn(py::handle obj);              // QAdd (qconv_eltwise.cpp)
void bind_xnn_plan(py::module_& m);            // xnn_plan.cpp

// The Python registrations of each source's kernels (called by bind_int8_kernels in qconv.cpp)
void bind_int8_gemm(py::module_& m);
void bind_int8_depthwise(py::module_& m);
void bind_int8_eltwise(py::module_& m);

}  // namespace int8
}  // namespace etlab_native
