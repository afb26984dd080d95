// Depthwise float convolutions (one filter per channel) for PackedConv2d: a direct NHWC loop in AVX-512, AVX2
// (one implementation over the vector width: conv_simd_kernels.h) and plain C++ forms. Split from conv.cpp to
// keep files small; DwArgs and the row entry points are declared in conv_internal.h.
#include "conv_internal.h"

#include <vector>

namespace etlab_native {
namespace conv_detail __attribute__((visibility("hidden"))) {

#ifdef ETLAB_CONV_X86
#include "conv_simd_forms.h"

__attribute__((target("avx512f"))) void dw_row_avx512(const DwArgs& a, int64_t n, int64_t oy) {
  avx512::dw_row<Avx512>(a, n, oy);
}

__attribute__((target("avx2,fma"))) void dw_row_avx2(const DwArgs& a, int64_t n, int64_t oy) {
  avx2::dw_row<Avx2>(a, n, oy);
}
#endif

void dw_row_plain(const DwArgs& a, int64_t n, int64_t oy) {
  const int64_t C = a.c, KW = a.g.kw;
  int64_t kh0, kh1;
  taps(oy, a.g.stride_h, a.g.pad_top, a.g.dilation_h, a.g.kh, a.h, kh0, kh1);
  const int64_t iy0 = oy * a.g.stride_h - a.g.pad_top;
  std::vector<float> acc(C);
  float* yrow = a.y + ((n * a.oh + oy) * a.ow) * C;
  for (int64_t ox = 0; ox < a.ow; ++ox) {
    int64_t kw0, kw1;
    taps(ox, a.g.stride_w, a.g.pad_left, a.g.dilation_w, KW, a.w_, kw0, kw1);
    const int64_t ix0 = ox * a.g.stride_w - a.g.pad_left;
    for (int64_t c = 0; c < C; ++c) acc[c] = a.b ? a.b[c] : 0.0f;
    for (int64_t ky = kh0; ky < kh1; ++ky)
      for (int64_t kx = kw0; kx < kw1; ++kx) {
        const float* xp = a.x + ((n * a.h + iy0 + ky * a.g.dilation_h) * a.w_ + ix0 + kx * a.g.dilation_w) * C;
        const float* wp = a.w + (ky * KW + kx) * C;
        for (int64_t c = 0; c < C; ++c) acc[c] += xp[c] * wp[c];
      }
    float* out = yrow + ox * C;
    for (int64_t c = 0; c < C; ++c) out[c] = fused_clamp(acc[c], a.lo, a.hi);
  }
}

}  // namespace conv_detail
}  // namespace etlab_native
