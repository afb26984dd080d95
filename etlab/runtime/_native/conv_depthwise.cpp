// Depthwise float convolutions (one filter per channel) for PackedConv2d: a direct NHWC loop in AVX-512, AVX2
// and plain C++ forms. Split from conv.cpp to keep files small; DwArgs and the row entry points are declared in
// conv_internal.h.
#include "conv_internal.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace etlab_native {
namespace conv_detail __attribute__((visibility("hidden"))) {

// The valid kernel taps [first, last) along one axis for output position `o`.
inline void taps(int64_t o, int64_t stride, int64_t pad, int64_t dilation, int64_t k, int64_t size, int64_t& first,
                 int64_t& last) {
  const int64_t start = o * stride - pad;
  first = 0;
  while (first < k && start + first * dilation < 0) ++first;
  last = k;
  while (last > first && start + (last - 1) * dilation >= size) --last;
}

#ifdef ETLAB_CONV_X86
// Outputs [ox_from, ox_to) of row (n, oy), every channel, 64 channels at a time in four registers: any
// geometry (the taps outside the input skipped).
__attribute__((target("avx512f"))) void dw_pixels_avx512(const DwArgs& a, int64_t n, int64_t oy, int64_t ox_from,
                                                         int64_t ox_to) {
  const int64_t C = a.c, KW = a.g.kw;
  int64_t kh0, kh1;
  taps(oy, a.g.stride_h, a.g.pad_top, a.g.dilation_h, a.g.kh, a.h, kh0, kh1);
  const int64_t iy0 = oy * a.g.stride_h - a.g.pad_top;
  const __m512 vlo = _mm512_set1_ps(a.lo), vhi = _mm512_set1_ps(a.hi);
  const __mmask16 tail = static_cast<__mmask16>((1u << (C % 16)) - 1);
  const int64_t c64 = C - C % 64, c16 = C - C % 16;
  float* yrow = a.y + ((n * a.oh + oy) * a.ow) * C;
  for (int64_t ox = ox_from; ox < ox_to; ++ox) {
    int64_t kw0, kw1;
    taps(ox, a.g.stride_w, a.g.pad_left, a.g.dilation_w, KW, a.w_, kw0, kw1);
    const int64_t ix0 = ox * a.g.stride_w - a.g.pad_left;
    float* out = yrow + ox * C;
    for (int64_t c = 0; c < c64; c += 64) {
      __m512 s0, s1, s2, s3;
      if (a.b) {
        s0 = _mm512_loadu_ps(a.b + c), s1 = _mm512_loadu_ps(a.b + c + 16);
        s2 = _mm512_loadu_ps(a.b + c + 32), s3 = _mm512_loadu_ps(a.b + c + 48);
      } else {
        s0 = s1 = s2 = s3 = _mm512_setzero_ps();
      }
      for (int64_t ky = kh0; ky < kh1; ++ky) {
        const float* xrow = a.x + ((n * a.h + iy0 + ky * a.g.dilation_h) * a.w_) * C + c;
        const float* wrow = a.w + (ky * KW) * C + c;
        for (int64_t kx = kw0; kx < kw1; ++kx) {
          const float* xp = xrow + (ix0 + kx * a.g.dilation_w) * C;
          const float* wp = wrow + kx * C;
          s0 = _mm512_fmadd_ps(_mm512_loadu_ps(xp), _mm512_loadu_ps(wp), s0);
          s1 = _mm512_fmadd_ps(_mm512_loadu_ps(xp + 16), _mm512_loadu_ps(wp + 16), s1);
          s2 = _mm512_fmadd_ps(_mm512_loadu_ps(xp + 32), _mm512_loadu_ps(wp + 32), s2);
          s3 = _mm512_fmadd_ps(_mm512_loadu_ps(xp + 48), _mm512_loadu_ps(wp + 48), s3);
        }
      }
      _mm512_storeu_ps(out + c, _mm512_min_ps(vhi, _mm512_max_ps(vlo, s0)));
      _mm512_storeu_ps(out + c + 16, _mm512_min_ps(vhi, _mm512_max_ps(vlo, s1)));
      _mm512_storeu_ps(out + c + 32, _mm512_min_ps(vhi, _mm512_max_ps(vlo, s2)));
      _mm512_storeu_ps(out + c + 48, _mm512_min_ps(vhi, _mm512_max_ps(vlo, s3)));
    }
    for (int64_t c = c64; c < C; c += 16) {
      const __mmask16 m = c < c16 ? static_cast<__mmask16>(0xFFFF) : tail;
      __m512 s = a.b ? _mm512_maskz_loadu_ps(m, a.b + c) : _mm512_setzero_ps();
      for (int64_t ky = kh0; ky < kh1; ++ky) {
        const float* xrow = a.x + ((n * a.h + iy0 + ky * a.g.dilation_h) * a.w_) * C + c;
        const float* wrow = a.w + (ky * KW) * C + c;
        for (int64_t kx = kw0; kx < kw1; ++kx)
          s = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, xrow + (ix0 + kx * a.g.dilation_w) * C),
                              _mm512_maskz_loadu_ps(m, wrow + kx * C), s);
      }
      _mm512_mask_storeu_ps(out + c, m, _mm512_min_ps(vhi, _mm512_max_ps(vlo, s)));
    }
  }
}

// Outputs [ox_from, ox_to) of row (n, oy) whose K columns of taps all lie inside the input, for a K x K
// filter: per block of 16 channels the filter taps stay in registers and four outputs are computed at once.
// S: the stride when it is 1 or 2 and there is no dilation (compiled for it), else 0 (any stride, dilation).
template <int K, int S>
__attribute__((target("avx512f"))) void dw_interior_avx512(const DwArgs& a, int64_t n, int64_t oy, int64_t ox_from,
                                                           int64_t ox_to) {
  const int64_t C = a.c, sw = a.g.stride_w, dw = a.g.dilation_w, dh = a.g.dilation_h;
  int64_t kh0, kh1;
  taps(oy, a.g.stride_h, a.g.pad_top, dh, K, a.h, kh0, kh1);
  const int64_t iy0 = oy * a.g.stride_h - a.g.pad_top;
  const __m512 vlo = _mm512_set1_ps(a.lo), vhi = _mm512_set1_ps(a.hi);
  const __mmask16 tail = C % 16 ? static_cast<__mmask16>((1u << (C % 16)) - 1) : static_cast<__mmask16>(0xFFFF);
  float* yrow = a.y + ((n * a.oh + oy) * a.ow) * C;
  const float* xbase = a.x + (n * a.h + iy0) * a.w_ * C;
  const int64_t xstep = sw * C;
  for (int64_t c = 0; c < C; c += 16) {
    const __mmask16 m = c + 16 <= C ? static_cast<__mmask16>(0xFFFF) : tail;
    __m512 w[K * K];
#pragma GCC unroll 25
    for (int t = 0; t < K * K; ++t) w[t] = _mm512_maskz_loadu_ps(m, a.w + t * C + c);
    const __m512 b = a.b ? _mm512_maskz_loadu_ps(m, a.b + c) : _mm512_setzero_ps();
    int64_t ox = ox_from;
    for (; ox + 4 <= ox_to; ox += 4) {
      __m512 s0 = b, s1 = b, s2 = b, s3 = b;
#pragma GCC unroll 5
      for (int ky = 0; ky < K; ++ky) {
        if (ky < kh0 || ky >= kh1) continue;
        const float* xp = xbase + (ky * dh * a.w_ + ox * sw - a.g.pad_left) * C + c;
        if constexpr (S > 0) {  // stride S, no dilation: each input column loaded once for the four outputs
#pragma GCC unroll 16
          for (int u = 0; u < 3 * S + K; ++u) {
            const __m512 v = _mm512_maskz_loadu_ps(m, xp + u * C);
            if (u < K) s0 = _mm512_fmadd_ps(v, w[ky * K + u], s0);
            if (u >= S && u - S < K) s1 = _mm512_fmadd_ps(v, w[ky * K + u - S], s1);
            if (u >= 2 * S && u - 2 * S < K) s2 = _mm512_fmadd_ps(v, w[ky * K + u - 2 * S], s2);
            if (u >= 3 * S && u - 3 * S < K) s3 = _mm512_fmadd_ps(v, w[ky * K + u - 3 * S], s3);
          }
        } else {
#pragma GCC unroll 5
          for (int kx = 0; kx < K; ++kx) {
            const float* q = xp + kx * dw * C;
            s0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q), w[ky * K + kx], s0);
            s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q + xstep), w[ky * K + kx], s1);
            s2 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q + 2 * xstep), w[ky * K + kx], s2);
            s3 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q + 3 * xstep), w[ky * K + kx], s3);
          }
        }
      }
      float* out = yrow + ox * C + c;
      _mm512_mask_storeu_ps(out, m, _mm512_min_ps(vhi, _mm512_max_ps(vlo, s0)));
      _mm512_mask_storeu_ps(out + C, m, _mm512_min_ps(vhi, _mm512_max_ps(vlo, s1)));
      _mm512_mask_storeu_ps(out + 2 * C, m, _mm512_min_ps(vhi, _mm512_max_ps(vlo, s2)));
      _mm512_mask_storeu_ps(out + 3 * C, m, _mm512_min_ps(vhi, _mm512_max_ps(vlo, s3)));
    }
    for (; ox < ox_to; ++ox) {
      __m512 s0 = b;
#pragma GCC unroll 5
      for (int ky = 0; ky < K; ++ky) {
        if (ky < kh0 || ky >= kh1) continue;
        const float* xp = xbase + (ky * dh * a.w_ + ox * sw - a.g.pad_left) * C + c;
#pragma GCC unroll 5
        for (int kx = 0; kx < K; ++kx) s0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, xp + kx * dw * C), w[ky * K + kx], s0);
      }
      _mm512_mask_storeu_ps(yrow + ox * C + c, m, _mm512_min_ps(vhi, _mm512_max_ps(vlo, s0)));
    }
  }
}

// One output row (n, oy): the outputs whose taps all lie inside the input by the register-blocked loop (3x3 and
// 5x5 filters), the others (and other filters) one at a time.
__attribute__((target("avx512f"))) void dw_row_avx512(const DwArgs& a, int64_t n, int64_t oy) {
  const int64_t K = a.g.kh;
  if (K != a.g.kw || (K != 3 && K != 5)) return dw_pixels_avx512(a, n, oy, 0, a.ow);
  // interior: ox * sw - pad_left >= 0 and ox * sw - pad_left + (K - 1) * dw < W
  const int64_t sw = a.g.stride_w, pl = a.g.pad_left;
  int64_t first = (pl + sw - 1) / sw;
  const int64_t reach = a.w_ - 1 - (K - 1) * a.g.dilation_w + pl;  // ox * sw <= reach
  int64_t last = reach < 0 ? 0 : reach / sw + 1;
  first = std::min(first, a.ow), last = std::max(first, std::min(last, a.ow));
  dw_pixels_avx512(a, n, oy, 0, first);
  const int s = a.g.dilation_w == 1 && (sw == 1 || sw == 2) ? static_cast<int>(sw) : 0;
  if (K == 3) {
    if (s == 1) dw_interior_avx512<3, 1>(a, n, oy, first, last);
    else if (s == 2) dw_interior_avx512<3, 2>(a, n, oy, first, last);
    else dw_interior_avx512<3, 0>(a, n, oy, first, last);
  } else {
    if (s == 1) dw_interior_avx512<5, 1>(a, n, oy, first, last);
    else if (s == 2) dw_interior_avx512<5, 2>(a, n, oy, first, last);
    else dw_interior_avx512<5, 0>(a, n, oy, first, last);
  }
  dw_pixels_avx512(a, n, oy, last, a.ow);
}

__attribute__((target("avx2,fma"))) void dw_row_avx2(const DwArgs& a, int64_t n, int64_t oy) {
  const int64_t C = a.c, KW = a.g.kw;
  int64_t kh0, kh1;
  taps(oy, a.g.stride_h, a.g.pad_top, a.g.dilation_h, a.g.kh, a.h, kh0, kh1);
  const int64_t iy0 = oy * a.g.stride_h - a.g.pad_top;
  const __m256 vlo = _mm256_set1_ps(a.lo), vhi = _mm256_set1_ps(a.hi);
  const int64_t c32 = C - C % 32, c8 = C - C % 8;
  float* yrow = a.y + ((n * a.oh + oy) * a.ow) * C;
  for (int64_t ox = 0; ox < a.ow; ++ox) {
    int64_t kw0, kw1;
    taps(ox, a.g.stride_w, a.g.pad_left, a.g.dilation_w, KW, a.w_, kw0, kw1);
    const int64_t ix0 = ox * a.g.stride_w - a.g.pad_left;
    float* out = yrow + ox * C;
    for (int64_t c = 0; c < c32; c += 32) {
      __m256 s0, s1, s2, s3;
      if (a.b) {
        s0 = _mm256_loadu_ps(a.b + c), s1 = _mm256_loadu_ps(a.b + c + 8);
        s2 = _mm256_loadu_ps(a.b + c + 16), s3 = _mm256_loadu_ps(a.b + c + 24);
      } else {
        s0 = s1 = s2 = s3 = _mm256_setzero_ps();
      }
      for (int64_t ky = kh0; ky < kh1; ++ky) {
        const float* xrow = a.x + ((n * a.h + iy0 + ky * a.g.dilation_h) * a.w_) * C + c;
        const float* wrow = a.w + (ky * KW) * C + c;
        for (int64_t kx = kw0; kx < kw1; ++kx) {
          const float* xp = xrow + (ix0 + kx * a.g.dilation_w) * C;
          const float* wp = wrow + kx * C;
          s0 = _mm256_fmadd_ps(_mm256_loadu_ps(xp), _mm256_loadu_ps(wp), s0);
          s1 = _mm256_fmadd_ps(_mm256_loadu_ps(xp + 8), _mm256_loadu_ps(wp + 8), s1);
          s2 = _mm256_fmadd_ps(_mm256_loadu_ps(xp + 16), _mm256_loadu_ps(wp + 16), s2);
          s3 = _mm256_fmadd_ps(_mm256_loadu_ps(xp + 24), _mm256_loadu_ps(wp + 24), s3);
        }
      }
      _mm256_storeu_ps(out + c, _mm256_min_ps(vhi, _mm256_max_ps(vlo, s0)));
      _mm256_storeu_ps(out + c + 8, _mm256_min_ps(vhi, _mm256_max_ps(vlo, s1)));
      _mm256_storeu_ps(out + c + 16, _mm256_min_ps(vhi, _mm256_max_ps(vlo, s2)));
      _mm256_storeu_ps(out + c + 24, _mm256_min_ps(vhi, _mm256_max_ps(vlo, s3)));
    }
    for (int64_t c = c32; c < c8; c += 8) {
      __m256 s = a.b ? _mm256_loadu_ps(a.b + c) : _mm256_setzero_ps();
      for (int64_t ky = kh0; ky < kh1; ++ky) {
        const float* xrow = a.x + ((n * a.h + iy0 + ky * a.g.dilation_h) * a.w_) * C + c;
        const float* wrow = a.w + (ky * KW) * C + c;
        for (int64_t kx = kw0; kx < kw1; ++kx)
          s = _mm256_fmadd_ps(_mm256_loadu_ps(xrow + (ix0 + kx * a.g.dilation_w) * C), _mm256_loadu_ps(wrow + kx * C),
                              s);
      }
      _mm256_storeu_ps(out + c, _mm256_min_ps(vhi, _mm256_max_ps(vlo, s)));
    }
    for (int64_t c = c8; c < C; ++c) {  // the last channels one at a time
      float s = a.b ? a.b[c] : 0.0f;
      for (int64_t ky = kh0; ky < kh1; ++ky)
        for (int64_t kx = kw0; kx < kw1; ++kx)
          s = std::fma(a.x[((n * a.h + iy0 + ky * a.g.dilation_h) * a.w_ + ix0 + kx * a.g.dilation_w) * C + c],
                       a.w[(ky * KW + kx) * C + c], s);
      out[c] = std::isnan(s) ? s : std::min(a.hi, std::max(a.lo, s));
    }
  }
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
    for (int64_t c = 0; c < C; ++c) out[c] = std::isnan(acc[c]) ? acc[c] : std::min(a.hi, std::max(a.lo, acc[c]));
  }
}

}  // namespace conv_detail
}  // namespace etlab_native
