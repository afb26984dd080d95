// The vector loops of the packed float kernels, written once as templates over a traits struct S (Avx512, Avx2:
// conv_internal.h). Included once per instruction set, each time inside that set's target region and its own
// namespace (conv_simd_forms.h), so that each copy is compiled for its set only; hence no include guard and
// no includes here (conv_internal.h comes first).
//
// Sums run in the same order in every form (the bias, then the taps row by row), each step one fused
// multiply-add, so a form's result does not depend on how its channels are split into registers.

// ---- bias + clamp over rows of an output (after MKL's GEMM) -----------------------------------------------

template <class S>
void epilogue_rows(float* y, int64_t rows, int64_t n, const float* bias, float lo, float hi) {
  using V = typename S::V;
  const V vlo = S::set1(lo), vhi = S::set1(hi);
  const int64_t full = n - n % S::kLanes;
  for (int64_t r = 0; r < rows; ++r) {
    float* row = y + r * n;
    for (int64_t j = 0; j < full; j += S::kLanes) {
      V v = S::load(row + j);
      if (bias) v = S::add(v, S::load(bias + j));
      S::store(row + j, S::clamp(v, vlo, vhi));
    }
    if (full == n) continue;
    if constexpr (S::kMasked) {
      const auto m = S::first(n - full);
      V v = S::load(row + full, m);
      if (bias) v = S::add(v, S::load(bias + full, m));
      S::store(row + full, S::clamp(v, vlo, vhi), m);
    } else {
      for (int64_t j = full; j < n; ++j) row[j] = fused_clamp(row[j] + (bias ? bias[j] : 0.0f), lo, hi);
    }
  }
}

// ---- depthwise ---------------------------------------------------------------------------------------------

// Outputs [ox_from, ox_to) of row (n, oy), every channel, 4 * kLanes channels at a time in four registers: any
// geometry (the taps outside the input skipped).
template <class S>
void dw_pixels(const DwArgs& a, int64_t n, int64_t oy, int64_t ox_from, int64_t ox_to) {
  using V = typename S::V;
  constexpr int64_t L = S::kLanes;
  const int64_t C = a.c, KW = a.g.kw;
  int64_t kh0, kh1;
  taps(oy, a.g.stride_h, a.g.pad_top, a.g.dilation_h, a.g.kh, a.h, kh0, kh1);
  const int64_t iy0 = oy * a.g.stride_h - a.g.pad_top;
  const V vlo = S::set1(a.lo), vhi = S::set1(a.hi);
  const int64_t c4 = C - C % (4 * L), c1 = C - C % L;
  float* yrow = a.y + ((n * a.oh + oy) * a.ow) * C;
  for (int64_t ox = ox_from; ox < ox_to; ++ox) {
    int64_t kw0, kw1;
    taps(ox, a.g.stride_w, a.g.pad_left, a.g.dilation_w, KW, a.w_, kw0, kw1);
    const int64_t ix0 = ox * a.g.stride_w - a.g.pad_left;
    float* out = yrow + ox * C;
    for (int64_t c = 0; c < c4; c += 4 * L) {
      V s0, s1, s2, s3;
      if (a.b) {
        s0 = S::load(a.b + c), s1 = S::load(a.b + c + L), s2 = S::load(a.b + c + 2 * L), s3 = S::load(a.b + c + 3 * L);
      } else {
        s0 = s1 = s2 = s3 = S::zero();
      }
      for (int64_t ky = kh0; ky < kh1; ++ky) {
        const float* xrow = a.x + ((n * a.h + iy0 + ky * a.g.dilation_h) * a.w_) * C + c;
        const float* wrow = a.w + (ky * KW) * C + c;
        for (int64_t kx = kw0; kx < kw1; ++kx) {
          const float* xp = xrow + (ix0 + kx * a.g.dilation_w) * C;
          const float* wp = wrow + kx * C;
          s0 = S::fma(S::load(xp), S::load(wp), s0);
          s1 = S::fma(S::load(xp + L), S::load(wp + L), s1);
          s2 = S::fma(S::load(xp + 2 * L), S::load(wp + 2 * L), s2);
          s3 = S::fma(S::load(xp + 3 * L), S::load(wp + 3 * L), s3);
        }
      }
      S::store(out + c, S::clamp(s0, vlo, vhi));
      S::store(out + c + L, S::clamp(s1, vlo, vhi));
      S::store(out + c + 2 * L, S::clamp(s2, vlo, vhi));
      S::store(out + c + 3 * L, S::clamp(s3, vlo, vhi));
    }
    for (int64_t c = c4; c < c1; c += L) {
      V s = a.b ? S::load(a.b + c) : S::zero();
      for (int64_t ky = kh0; ky < kh1; ++ky) {
        const float* xrow = a.x + ((n * a.h + iy0 + ky * a.g.dilation_h) * a.w_) * C + c;
        const float* wrow = a.w + (ky * KW) * C + c;
        for (int64_t kx = kw0; kx < kw1; ++kx)
          s = S::fma(S::load(xrow + (ix0 + kx * a.g.dilation_w) * C), S::load(wrow + kx * C), s);
      }
      S::store(out + c, S::clamp(s, vlo, vhi));
    }
    if (c1 == C) continue;
    if constexpr (S::kMasked) {  // the last channels in one masked register
      const auto m = S::first(C - c1);
      V s = a.b ? S::load(a.b + c1, m) : S::zero();
      for (int64_t ky = kh0; ky < kh1; ++ky) {
        const float* xrow = a.x + ((n * a.h + iy0 + ky * a.g.dilation_h) * a.w_) * C + c1;
        const float* wrow = a.w + (ky * KW) * C + c1;
        for (int64_t kx = kw0; kx < kw1; ++kx)
          s = S::fma(S::load(xrow + (ix0 + kx * a.g.dilation_w) * C, m), S::load(wrow + kx * C, m), s);
      }
      S::store(out + c1, S::clamp(s, vlo, vhi), m);
    } else {  // the last channels one at a time
      for (int64_t c = c1; c < C; ++c) {
        float s = a.b ? a.b[c] : 0.0f;
        for (int64_t ky = kh0; ky < kh1; ++ky)
          for (int64_t kx = kw0; kx < kw1; ++kx)
            s = std::fma(a.x[((n * a.h + iy0 + ky * a.g.dilation_h) * a.w_ + ix0 + kx * a.g.dilation_w) * C + c],
                         a.w[(ky * KW + kx) * C + c], s);
        out[c] = fused_clamp(s, a.lo, a.hi);
      }
    }
  }
}

// Outputs [ox_from, ox_to) of row (n, oy) whose K columns of taps all lie inside the input, for a K x K
// filter: per register of channels the filter taps stay in registers and four outputs are computed at once
// (S::kTapsInRegisters; a row's last channels by a masked register, S::kMasked).
// St: the stride when it is 1 or 2 and there is no dilation (compiled for it), else 0 (any stride, dilation).
template <class S, int K, int St>
void dw_interior(const DwArgs& a, int64_t n, int64_t oy, int64_t ox_from, int64_t ox_to) {
  static_assert(S::kMasked && S::kTapsInRegisters, "the register-blocked loop needs masked loads and 32 registers");
  using V = typename S::V;
  const int64_t C = a.c, sw = a.g.stride_w, dw = a.g.dilation_w, dh = a.g.dilation_h;
  int64_t kh0, kh1;
  taps(oy, a.g.stride_h, a.g.pad_top, dh, K, a.h, kh0, kh1);
  const int64_t iy0 = oy * a.g.stride_h - a.g.pad_top;
  const V vlo = S::set1(a.lo), vhi = S::set1(a.hi);
  float* yrow = a.y + ((n * a.oh + oy) * a.ow) * C;
  const float* xbase = a.x + (n * a.h + iy0) * a.w_ * C;
  const int64_t xstep = sw * C;
  for (int64_t c = 0; c < C; c += S::kLanes) {
    const auto m = S::first(C - c);
    V w[K * K];
#pragma GCC unroll 25
    for (int t = 0; t < K * K; ++t) w[t] = S::load(a.w + t * C + c, m);
    const V b = a.b ? S::load(a.b + c, m) : S::zero();
    int64_t ox = ox_from;
    for (; ox + 4 <= ox_to; ox += 4) {
      V s0 = b, s1 = b, s2 = b, s3 = b;
#pragma GCC unroll 5
      for (int ky = 0; ky < K; ++ky) {
        if (ky < kh0 || ky >= kh1) continue;
        const float* xp = xbase + (ky * dh * a.w_ + ox * sw - a.g.pad_left) * C + c;
        if constexpr (St > 0) {  // stride St, no dilation: each input column loaded once for the four outputs
#pragma GCC unroll 16
          for (int u = 0; u < 3 * St + K; ++u) {
            const V v = S::load(xp + u * C, m);
            if (u < K) s0 = S::fma(v, w[ky * K + u], s0);
            if (u >= St && u - St < K) s1 = S::fma(v, w[ky * K + u - St], s1);
            if (u >= 2 * St && u - 2 * St < K) s2 = S::fma(v, w[ky * K + u - 2 * St], s2);
            if (u >= 3 * St && u - 3 * St < K) s3 = S::fma(v, w[ky * K + u - 3 * St], s3);
          }
        } else {
#pragma GCC unroll 5
          for (int kx = 0; kx < K; ++kx) {
            const float* q = xp + kx * dw * C;
            s0 = S::fma(S::load(q, m), w[ky * K + kx], s0);
            s1 = S::fma(S::load(q + xstep, m), w[ky * K + kx], s1);
            s2 = S::fma(S::load(q + 2 * xstep, m), w[ky * K + kx], s2);
            s3 = S::fma(S::load(q + 3 * xstep, m), w[ky * K + kx], s3);
          }
        }
      }
      float* out = yrow + ox * C + c;
      S::store(out, S::clamp(s0, vlo, vhi), m);
      S::store(out + C, S::clamp(s1, vlo, vhi), m);
      S::store(out + 2 * C, S::clamp(s2, vlo, vhi), m);
      S::store(out + 3 * C, S::clamp(s3, vlo, vhi), m);
    }
    for (; ox < ox_to; ++ox) {
      V s0 = b;
#pragma GCC unroll 5
      for (int ky = 0; ky < K; ++ky) {
        if (ky < kh0 || ky >= kh1) continue;
        const float* xp = xbase + (ky * dh * a.w_ + ox * sw - a.g.pad_left) * C + c;
#pragma GCC unroll 5
        for (int kx = 0; kx < K; ++kx) s0 = S::fma(S::load(xp + kx * dw * C, m), w[ky * K + kx], s0);
      }
      S::store(yrow + ox * C + c, S::clamp(s0, vlo, vhi), m);
    }
  }
}

// One output row (n, oy). Where the filter's taps fit in registers, the outputs whose taps all lie inside the
// input by the register-blocked loop (3x3 and 5x5 filters) and the others one at a time; elsewhere every
// output one at a time.
template <class S>
void dw_row(const DwArgs& a, int64_t n, int64_t oy) {
  const int64_t K = a.g.kh;
  if constexpr (!S::kTapsInRegisters) {
    return dw_pixels<S>(a, n, oy, 0, a.ow);
  } else {
    if (K != a.g.kw || (K != 3 && K != 5)) return dw_pixels<S>(a, n, oy, 0, a.ow);
    // interior: ox * sw - pad_left >= 0 and ox * sw - pad_left + (K - 1) * dw < W
    const int64_t sw = a.g.stride_w, pl = a.g.pad_left;
    int64_t first = (pl + sw - 1) / sw;
    const int64_t reach = a.w_ - 1 - (K - 1) * a.g.dilation_w + pl;  // ox * sw <= reach
    int64_t last = reach < 0 ? 0 : reach / sw + 1;
    first = std::min(first, a.ow), last = std::max(first, std::min(last, a.ow));
    dw_pixels<S>(a, n, oy, 0, first);
    const int s = a.g.dilation_w == 1 && (sw == 1 || sw == 2) ? static_cast<int>(sw) : 0;
    if (K == 3) {
      if (s == 1) dw_interior<S, 3, 1>(a, n, oy, first, last);
      else if (s == 2) dw_interior<S, 3, 2>(a, n, oy, first, last);
      else dw_interior<S, 3, 0>(a, n, oy, first, last);
    } else {
      if (s == 1) dw_interior<S, 5, 1>(a, n, oy, first, last);
      else if (s == 2) dw_interior<S, 5, 2>(a, n, oy, first, last);
      else dw_interior<S, 5, 0>(a, n, oy, first, last);
    }
    dw_pixels<S>(a, n, oy, last, a.ow);
  }
}
