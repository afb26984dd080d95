// Internal declarations shared by the packed float kernel sources (conv.cpp and conv_depthwise.cpp): the
// depthwise kernels' arguments and row entry points, which PackedConv2d::run (conv.cpp) dispatches to, and the
// vector forms the kernels' loops are written once for (conv_simd_kernels.h). The kernels are split into files
// only to keep each one small; this header is no public interface.
#pragma once

#include "conv.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define ETLAB_CONV_X86 1
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace etlab_native {
// hidden, as pybind11 is: these names are internal to the module
namespace conv_detail __attribute__((visibility("hidden"))) {

// max(lo, v) then min(hi, .), a NaN kept (as torch.clamp keeps it): the plain C++ form of the fused clamp.
inline float fused_clamp(float v, float lo, float hi) { return std::isnan(v) ? v : std::min(hi, std::max(lo, v)); }

// The valid kernel taps [first, last) along one axis for output position `o`.
inline void taps(int64_t o, int64_t stride, int64_t pad, int64_t dilation, int64_t k, int64_t size, int64_t& first,
                 int64_t& last) {
  const int64_t start = o * stride - pad;
  first = 0;
  while (first < k && start + first * dilation < 0) ++first;
  last = k;
  while (last > first && start + (last - 1) * dilation >= size) --last;
}

// ---- depthwise ---------------------------------------------------------------------------------------------

struct DwArgs {
  const float* x;   // [N, H, W, C] contiguous
  const float* w;   // [KH*KW, C]
  const float* b;   // [C] or nullptr
  float* y;         // [N, OH, OW, C]
  int64_t h, w_, c, oh, ow;
  ConvGeometry g;
  float lo, hi;
};

// Output row (n, oy) of a depthwise convolution, every channel, into a.y (conv_depthwise.cpp)
#ifdef ETLAB_CONV_X86
__attribute__((target("avx512f"))) void dw_row_avx512(const DwArgs& a, int64_t n, int64_t oy);
__attribute__((target("avx2,fma"))) void dw_row_avx2(const DwArgs& a, int64_t n, int64_t oy);
#endif
void dw_row_plain(const DwArgs& a, int64_t n, int64_t oy);

// ---- vector forms ------------------------------------------------------------------------------------------
// One traits struct per instruction set: a register of kLanes floats and the operations the kernels use on it.
// The kernels (conv_simd_kernels.h) are templates over it, compiled once per set inside that set's target region
// (ETLAB_TARGET_BEGIN / ETLAB_TARGET_END): a function's instruction set cannot be a template parameter, and
// code compiled for AVX-512 must never run on a CPU with AVX2 only.

#ifdef ETLAB_CONV_X86
#define ETLAB_PRAGMA(text) _Pragma(#text)
#ifdef __clang__
#define ETLAB_TARGET_BEGIN(isa) ETLAB_PRAGMA(clang attribute push(__attribute__((target(isa))), apply_to = function))
#define ETLAB_TARGET_END ETLAB_PRAGMA(clang attribute pop)
#else
#define ETLAB_TARGET_BEGIN(isa) ETLAB_PRAGMA(GCC push_options) ETLAB_PRAGMA(GCC target(isa))
#define ETLAB_TARGET_END ETLAB_PRAGMA(GCC pop_options)
#endif

#define ETLAB_AVX512_OP __attribute__((target("avx512f"), always_inline)) static inline
#define ETLAB_AVX2_OP __attribute__((target("avx2,fma"), always_inline)) static inline

// The clamps (min(hi, max(lo, v))) return the second operand when either is NaN: a NaN stays NaN, as in fused_clamp().
struct Avx512 {
  using V = __m512;
  using Mask = __mmask16;
  static constexpr int64_t kLanes = 16;
  static constexpr bool kMasked = true;          // a row's last C % 16 channels by masked loads and stores
  static constexpr bool kTapsInRegisters = true;  // 32 registers: a 5x5 filter's taps and four sums fit
  ETLAB_AVX512_OP V zero() { return _mm512_setzero_ps(); }
  ETLAB_AVX512_OP V set1(float v) { return _mm512_set1_ps(v); }
  ETLAB_AVX512_OP V load(const float* p) { return _mm512_loadu_ps(p); }
  ETLAB_AVX512_OP void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  ETLAB_AVX512_OP V add(V a, V b) { return _mm512_add_ps(a, b); }
  ETLAB_AVX512_OP V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  ETLAB_AVX512_OP V clamp(V v, V lo, V hi) { return _mm512_min_ps(hi, _mm512_max_ps(lo, v)); }
  // the first `n` lanes (all of them from 16 on)
  ETLAB_AVX512_OP Mask first(int64_t n) {
    return n >= kLanes ? static_cast<Mask>(0xFFFF) : static_cast<Mask>((1u << n) - 1);
  }
  ETLAB_AVX512_OP V load(const float* p, Mask m) { return _mm512_maskz_loadu_ps(m, p); }  // zeros elsewhere
  ETLAB_AVX512_OP void store(float* p, V v, Mask m) { _mm512_mask_storeu_ps(p, m, v); }
};

struct Avx2 {
  using V = __m256;
  static constexpr int64_t kLanes = 8;
  static constexpr bool kMasked = false;          // a row's last C % 8 channels one at a time, in plain C++
  static constexpr bool kTapsInRegisters = false;  // 16 registers: not enough for a filter's taps and the sums
  ETLAB_AVX2_OP V zero() { return _mm256_setzero_ps(); }
  ETLAB_AVX2_OP V set1(float v) { return _mm256_set1_ps(v); }
  ETLAB_AVX2_OP V load(const float* p) { return _mm256_loadu_ps(p); }
  ETLAB_AVX2_OP void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  ETLAB_AVX2_OP V add(V a, V b) { return _mm256_add_ps(a, b); }
  ETLAB_AVX2_OP V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  ETLAB_AVX2_OP V clamp(V v, V lo, V hi) { return _mm256_min_ps(hi, _mm256_max_ps(lo, v)); }
};

#undef ETLAB_AVX512_OP
#undef ETLAB_AVX2_OP
#endif

}  // namespace conv_detail
}  // namespace etlab_native
