// Native int8 kernels for XNNPACK's quantized graphs (see qconv.h).
//
// Values: an int8 activation q (zero point z) is held as the byte q + 128 (uint8), which is what AVX-512
// VNNI's vpdpbusd multiplies (unsigned bytes x signed bytes -> int32, four at a time). With the zero point
// in the same shifted form, sum((x - z) * w) = sum(x * w) - z * sum(w): the second term is folded into the
// bias once, when the weights are packed, so a call does only the products.
//
// Requantization as XNNPACK's fp32 scheme: int32 accumulator (bias included) -> float, times the output
// channel's scale (input scale * filter scale / output scale), clamped to the output's bounds less its zero
// point, rounded to nearest-even, plus the zero point. Adds in XNNPACK's fixed-point form: each input times an
// integer multiplier, a rounding shift, the output zero point, the bounds.
//
// Each kernel has three forms: AVX-512 (F/BW/VL/VNNI), AVX2 and scalar; the widest the CPU has is used, capped
// by ETLAB_INT8_ISA (scalar | avx2 | vnni) or by the `isa` argument (0 scalar, 1 AVX2, 2 VNNI; -1: the
// default), which is how the narrower forms are tested on a machine that has the wider ones.
#include "qconv.h"

#include <ATen/ATen.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace etlab_native {
namespace {

namespace py = pybind11;

#define ETLAB_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
#define ETLAB_AVX2 __attribute__((target("avx2,fma")))

enum Isa : int { kScalar = 0, kAvx2 = 1, kVnni = 2 };

int detected_isa() {
  static const int isa = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni"))
      return int(kVnni);
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return int(kAvx2);
    return int(kScalar);
  }();
  return isa;
}

// The kernel form for an object made now: the widest the CPU has, capped by ETLAB_INT8_ISA and `requested`.
int choose_isa(int64_t requested) {
  int isa = detected_isa();
  if (const char* env = std::getenv("ETLAB_INT8_ISA"); env != nullptr && *env != '\0') {
    std::string v(env);
    int cap = v == "scalar" ? int(kScalar) : v == "avx2" ? int(kAvx2) : v == "vnni" ? int(kVnni) : -1;
    if (cap < 0) throw std::invalid_argument("ETLAB_INT8_ISA is '" + v + "'; it must be scalar, avx2 or vnni");
    isa = std::min(isa, cap);
  }
  if (requested > 2) throw std::invalid_argument("isa must be -1 (default), 0 (scalar), 1 (AVX2) or 2 (VNNI)");
  if (requested >= 0) isa = std::min<int>(isa, int(requested));
  return isa;
}

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

// ---------------------------------------------------------------------------------------------------
// GEMM: Y[m, n] = requant(bias[n] + sum_k A[m, k] * W[n, k]); A unsigned bytes, W signed bytes packed in
// blocks of 16 output channels, each block a run of 4-byte groups: [group][channel 0..15][4 bytes].
// ---------------------------------------------------------------------------------------------------

struct PackedGemm {
  int64_t N = 0, K = 0, Np = 0, Kp = 0;
  std::vector<int8_t> w;  // Np / 16 blocks of Kp * 16 bytes
  const int8_t* block(int64_t nb) const { return w.data() + nb * Kp * 16; }
  int8_t at(int64_t n, int64_t k) const { return block(n / 16)[(k / 4) * 64 + (n % 16) * 4 + k % 4]; }
};

// W: [N, K] int8 row-major
PackedGemm pack_gemm(const int8_t* W, int64_t N, int64_t K) {
  PackedGemm p;
  p.N = N, p.K = K, p.Np = round_up(N, 16), p.Kp = round_up(K, 4);
  p.w.assign(size_t(p.Np * p.Kp), 0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) p.w[size_t((n / 16) * p.Kp * 16 + (k / 4) * 64 + (n % 16) * 4 + k % 4)] = W[n * K + k];
  return p;
}

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

// MR rows x NB blocks of 16 channels; `nvalid`: channels of the tile that exist (the last tile's may not)
template <int MR, int NB>
ETLAB_VNNI void gemm_tile_vnni(const uint8_t* a, int64_t lda, int64_t K, const int8_t* w, int64_t wstride,
                               const int32_t* bias, const float* scale, uint8_t* y, int64_t ldy, int64_t nvalid,
                               const Bounds& bd) {
  __m512i acc[MR][NB];
#pragma GCC unroll 4
  for (int j = 0; j < NB; ++j) {
    __m512i b = _mm512_loadu_si512(bias + 16 * j);
#pragma GCC unroll 4
    for (int m = 0; m < MR; ++m) acc[m][j] = b;
  }
  const int64_t groups = K / 4, rem = K % 4;
  for (int64_t g = 0; g < groups; ++g) {
    __m512i b[NB];
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) b[j] = _mm512_loadu_si512(w + j * wstride + g * 64);
#pragma GCC unroll 4
    for (int m = 0; m < MR; ++m) {
      __m512i av = _mm512_set1_epi32(load4(a + m * lda + 4 * g));
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) acc[m][j] = _mm512_dpbusd_epi32(acc[m][j], av, b[j]);
    }
  }
  if (rem) {
    __m512i b[NB];
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) b[j] = _mm512_loadu_si512(w + j * wstride + groups * 64);
#pragma GCC unroll 4
    for (int m = 0; m < MR; ++m) {
      __m512i av = _mm512_set1_epi32(load_tail(a + m * lda + 4 * groups, rem));
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) acc[m][j] = _mm512_dpbusd_epi32(acc[m][j], av, b[j]);
    }
  }
  const __m512 fmin = _mm512_set1_ps(bd.fmin()), fmax = _mm512_set1_ps(bd.fmax());
  const __m512i zp = _mm512_set1_epi32(bd.zp);
#pragma GCC unroll 4
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j)
      if (16 * j < nvalid)
        store16_vnni(y + m * ldy + 16 * j, requant16_vnni(acc[m][j], scale + 16 * j, fmin, fmax, zp), nvalid - 16 * j);
}

using VnniTile = void (*)(const uint8_t*, int64_t, int64_t, const int8_t*, int64_t, const int32_t*, const float*,
                          uint8_t*, int64_t, int64_t, const Bounds&);

template <int MR>
constexpr VnniTile vnni_tiles_row[4] = {gemm_tile_vnni<MR, 1>, gemm_tile_vnni<MR, 2>, gemm_tile_vnni<MR, 3>,
                                        gemm_tile_vnni<MR, 4>};

void gemm_vnni(const PackedGemm& P, const Epilogue& E, const uint8_t* A, int64_t lda, int64_t M, uint8_t* Y,
               int64_t ldy, const Bounds& bd) {
  static const VnniTile* tiles[4] = {vnni_tiles_row<1>, vnni_tiles_row<2>, vnni_tiles_row<3>, vnni_tiles_row<4>};
  const int64_t blocks = P.Np / 16, wstride = P.Kp * 16;
  for (int64_t nb = 0; nb < blocks; nb += 4) {
    const int64_t nbs = std::min<int64_t>(4, blocks - nb), n0 = nb * 16;
    const int64_t nvalid = std::min<int64_t>(P.N - n0, nbs * 16);
    for (int64_t m0 = 0; m0 < M; m0 += 4) {
      const int64_t mr = std::min<int64_t>(4, M - m0);
      tiles[mr - 1][nbs - 1](A + m0 * lda, lda, P.K, P.block(nb), wstride, E.bias.data() + n0, E.scale.data() + n0,
                             Y + m0 * ldy + n0, ldy, nvalid, bd);
    }
  }
}

// AVX2: vpdpbusd emulated on the same packing: the even and odd bytes of each 4-byte group widened to 16
// bits (unsigned activations, signed weights) and multiplied pairwise into 32 bits by vpmaddwd (exact).
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

template <int MR>
ETLAB_AVX2 void gemm_tile_avx2(const uint8_t* a, int64_t lda, int64_t K, const int8_t* w, const int32_t* bias,
                               const float* scale, uint8_t* y, int64_t ldy, int64_t nvalid, const Bounds& bd) {
  __m256i acc[MR][2];
#pragma GCC unroll 4
  for (int m = 0; m < MR; ++m) {
    acc[m][0] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bias));
    acc[m][1] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bias + 8));
  }
  const __m256i low = _mm256_set1_epi16(0x00FF);
  const int64_t groups = (K + 3) / 4;
  for (int64_t g = 0; g < groups; ++g) {
    __m256i b0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + g * 64));
    __m256i b1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + g * 64 + 32));
    __m256i be0 = _mm256_srai_epi16(_mm256_slli_epi16(b0, 8), 8), bo0 = _mm256_srai_epi16(b0, 8);
    __m256i be1 = _mm256_srai_epi16(_mm256_slli_epi16(b1, 8), 8), bo1 = _mm256_srai_epi16(b1, 8);
    const int64_t rem = std::min<int64_t>(4, K - 4 * g);
#pragma GCC unroll 4
    for (int m = 0; m < MR; ++m) {
      const uint8_t* p = a + m * lda + 4 * g;
      __m256i av = _mm256_set1_epi32(rem == 4 ? load4(p) : load_tail(p, rem));
      __m256i ae = _mm256_and_si256(av, low), ao = _mm256_srli_epi16(av, 8);
      acc[m][0] = _mm256_add_epi32(acc[m][0], _mm256_add_epi32(_mm256_madd_epi16(ae, be0), _mm256_madd_epi16(ao, bo0)));
      acc[m][1] = _mm256_add_epi32(acc[m][1], _mm256_add_epi32(_mm256_madd_epi16(ae, be1), _mm256_madd_epi16(ao, bo1)));
    }
  }
#pragma GCC unroll 4
  for (int m = 0; m < MR; ++m) {
    store8_avx2(y + m * ldy, acc[m][0], scale, bd, nvalid);
    store8_avx2(y + m * ldy + 8, acc[m][1], scale + 8, bd, nvalid - 8);
  }
}

void gemm_avx2(const PackedGemm& P, const Epilogue& E, const uint8_t* A, int64_t lda, int64_t M, uint8_t* Y,
               int64_t ldy, const Bounds& bd) {
  using Tile = void (*)(const uint8_t*, int64_t, int64_t, const int8_t*, const int32_t*, const float*, uint8_t*,
                        int64_t, int64_t, const Bounds&);
  static const Tile tiles[4] = {gemm_tile_avx2<1>, gemm_tile_avx2<2>, gemm_tile_avx2<3>, gemm_tile_avx2<4>};
  for (int64_t nb = 0; nb < P.Np / 16; ++nb) {
    const int64_t n0 = nb * 16, nvalid = std::min<int64_t>(16, P.N - n0);
    for (int64_t m0 = 0; m0 < M; m0 += 4) {
      const int64_t mr = std::min<int64_t>(4, M - m0);
      tiles[mr - 1](A + m0 * lda, lda, P.K, P.block(nb), E.bias.data() + n0, E.scale.data() + n0, Y + m0 * ldy + n0,
                    ldy, nvalid, bd);
    }
  }
}

void gemm_scalar(const PackedGemm& P, const Epilogue& E, const uint8_t* A, int64_t lda, int64_t M, uint8_t* Y,
                 int64_t ldy, const Bounds& bd) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < P.N; ++n) {
      int32_t acc = E.bias[size_t(n)];
      for (int64_t k = 0; k < P.K; ++k) acc += int32_t(A[m * lda + k]) * int32_t(P.at(n, k));
      Y[m * ldy + n] = requant_scalar(acc, E.scale[size_t(n)], bd);
    }
}

void gemm(int isa, const PackedGemm& P, const Epilogue& E, const uint8_t* A, int64_t lda, int64_t M, uint8_t* Y,
          int64_t ldy, const Bounds& bd) {
  if (isa == kVnni) return gemm_vnni(P, E, A, lda, M, Y, ldy, bd);
  if (isa == kAvx2) return gemm_avx2(P, E, A, lda, M, Y, ldy, bd);
  gemm_scalar(P, E, A, lda, M, Y, ldy, bd);
}

// ---------------------------------------------------------------------------------------------------
// Shared argument checks and the epilogue made at load
// ---------------------------------------------------------------------------------------------------

void check(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument(message);
}

at::Tensor contiguous_u8(const at::Tensor& x, const char* what) {
  check(x.scalar_type() == at::kByte, std::string(what) + " must be uint8 (int8 values shifted by 128), got " +
                                          std::string(c10::toString(x.scalar_type())));
  return x.is_contiguous() ? x : x.contiguous();
}

// bias (int32 [N]) with -x_zp * sum_k W[n, k] folded in; scales (float32 [N]); both padded to 16
Epilogue make_epilogue(const at::Tensor& bias, const at::Tensor& scale, const std::vector<int64_t>& wsum, int64_t N,
                       int64_t x_zp) {
  check(scale.scalar_type() == at::kFloat && scale.dim() == 1 && scale.numel() == N,
        "scale must be float32 [" + std::to_string(N) + "]");
  check(!bias.defined() || (bias.scalar_type() == at::kInt && bias.dim() == 1 && bias.numel() == N),
        "bias must be int32 [" + std::to_string(N) + "] or None");
  Epilogue e;
  const int64_t Np = round_up(N, 16);
  e.bias.assign(size_t(Np), 0);
  e.scale.assign(size_t(Np), 0.f);
  at::Tensor b = bias.defined() ? bias.contiguous() : at::Tensor();
  at::Tensor s = scale.contiguous();
  for (int64_t n = 0; n < N; ++n) {
    int64_t v = (b.defined() ? int64_t(b.data_ptr<int32_t>()[n]) : 0) - x_zp * wsum[size_t(n)];
    check(v >= INT32_MIN && v <= INT32_MAX, "bias out of int32 range after folding the input zero point");
    e.bias[size_t(n)] = int32_t(v);
    e.scale[size_t(n)] = s.data_ptr<float>()[n];
    check(std::isfinite(e.scale[size_t(n)]), "scale must be finite");
  }
  return e;
}

Bounds make_bounds(int64_t y_zp, int64_t lo, int64_t hi) {
  check(0 <= lo && lo <= hi && hi <= 255 && 0 <= y_zp && y_zp <= 255,
        "zero point and bounds must be uint8 values with lo <= hi");
  return Bounds{int32_t(y_zp), int32_t(lo), int32_t(hi)};
}

struct Geometry {
  int64_t kh, kw, sh, sw, dh, dw, pt, pl, pb, pr;
  int64_t out_h(int64_t h) const { return (h + pt + pb - dh * (kh - 1) - 1) / sh + 1; }
  int64_t out_w(int64_t w) const { return (w + pl + pr - dw * (kw - 1) - 1) / sw + 1; }
};

Geometry make_geometry(int64_t kh, int64_t kw, const std::vector<int64_t>& pads, const std::vector<int64_t>& stride,
                       const std::vector<int64_t>& dilation) {
  check(pads.size() == 4 && stride.size() == 2 && dilation.size() == 2,
        "pads are (top, left, bottom, right), stride and dilation (height, width)");
  Geometry g{kh, kw, stride[0], stride[1], dilation[0], dilation[1], pads[0], pads[1], pads[2], pads[3]};
  check(g.sh >= 1 && g.sw >= 1 && g.dh >= 1 && g.dw >= 1 && g.pt >= 0 && g.pl >= 0 && g.pb >= 0 && g.pr >= 0 &&
            kh >= 1 && kw >= 1,
        "stride and dilation must be >= 1, paddings >= 0");
  return g;
}

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

// n bytes from src (or, with `fill`, n copies of src[0]); short runs without a call into memcpy
inline void copy_bytes(uint8_t* dst, const uint8_t* src, int64_t n, bool fill = false) {
  if (fill) {
    std::memset(dst, src[0], size_t(n));
  } else if (n > 16) {
    std::memcpy(dst, src, size_t(n));
  } else if (n >= 8) {  // two overlapping 8-byte moves
    uint64_t a, b;
    std::memcpy(&a, src, 8);
    std::memcpy(&b, src + n - 8, 8);
    std::memcpy(dst, &a, 8);
    std::memcpy(dst + n - 8, &b, 8);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = src[i];
  }
}

// Releases the GIL for calls with this much work or more (multiply-adds or elements); a small call's release and
// re-acquire would cost more than the other threads gain.
constexpr int64_t kReleaseGilWork = int64_t(1) << 17;

struct MaybeReleaseGil {
  explicit MaybeReleaseGil(int64_t work) {
    if (work >= kReleaseGilWork) release.emplace();
  }
  std::optional<py::gil_scoped_release> release;
};

std::vector<uint8_t>& scratch(size_t bytes) {
  thread_local std::vector<uint8_t> buffer;
  if (buffer.size() < bytes) buffer.resize(bytes);
  return buffer;
}

// ---------------------------------------------------------------------------------------------------
// Dense convolution (groups 1) and fully connected: the GEMM, on the input's rows (1x1, stride 1, no
// padding) or on rows gathered from each output pixel's taps (im2col, a band of pixels at a time)
// ---------------------------------------------------------------------------------------------------

class QConv2d {
 public:
  // weight: int8 [O, KH, KW, I] (OHWI, XNNPACK's filter layout); bias int32 [O] or None; scale float32 [O]
  QConv2d(const at::Tensor& weight, const c10::optional<at::Tensor>& bias, const at::Tensor& scale,
          std::vector<int64_t> pads, std::vector<int64_t> stride, std::vector<int64_t> dilation, int64_t x_zp,
          int64_t y_zp, int64_t lo, int64_t hi, int64_t isa)
      : isa_(choose_isa(isa)), bounds_(make_bounds(y_zp, lo, hi)) {
    check(weight.scalar_type() == at::kChar && weight.dim() == 4, "weight must be int8 [O, KH, KW, I]");
    check(0 <= x_zp && x_zp <= 255, "input zero point must be a uint8 value");
    O_ = weight.size(0), I_ = weight.size(3);
    geo_ = make_geometry(weight.size(1), weight.size(2), pads, stride, dilation);
    const int64_t K = geo_.kh * geo_.kw * I_;
    check(O_ >= 1 && K >= 1, "weight must not be empty");
    at::Tensor w = weight.contiguous();
    const int8_t* wd = w.data_ptr<int8_t>();
    packed_ = pack_gemm(wd, O_, K);
    std::vector<int64_t> wsum(size_t(O_), 0);
    for (int64_t o = 0; o < O_; ++o)
      for (int64_t k = 0; k < K; ++k) wsum[size_t(o)] += wd[o * K + k];
    epi_ = make_epilogue(bias.has_value() ? *bias : at::Tensor(), scale, wsum, O_, x_zp);
    zeros_.assign(size_t(I_ + 64), uint8_t(x_zp));
    direct_ = geo_.kh == 1 && geo_.kw == 1 && geo_.sh == 1 && geo_.sw == 1 && geo_.pt + geo_.pl + geo_.pb + geo_.pr == 0;
  }

  // x: uint8 NHWC [N, H, W, I] -> uint8 NHWC [N, OH, OW, O]; lo/hi < 0: the bounds given at load
  at::Tensor run(const at::Tensor& x_in, int64_t lo, int64_t hi) const {
    // Gathered convolutions take any strides (an NCHW image seen as NHWC: the graph's input transpose)
    const bool strided = !direct_ && x_in.scalar_type() == at::kByte && !x_in.is_contiguous();
    at::Tensor x = strided ? x_in : contiguous_u8(x_in, "input");
    check(x.dim() == 4 && x.size(3) == I_, "input must be NHWC with " + std::to_string(I_) + " channels");
    const int64_t N = x.size(0), H = x.size(1), W = x.size(2), OH = geo_.out_h(H), OW = geo_.out_w(W);
    check(OH >= 1 && OW >= 1, "input is smaller than the kernel");
    const int64_t sN = x.stride(0), sH = x.stride(1), sW = x.stride(2), sC = x.stride(3);
    at::Tensor y = at::empty({N, OH, OW, O_}, x.options());
    const Bounds bd = call_bounds(lo, hi);
    const uint8_t* xd = x.data_ptr<uint8_t>();
    uint8_t* yd = y.data_ptr<uint8_t>();
    MaybeReleaseGil gil(N * OH * OW * O_ * packed_.K);
    if (direct_) {
      gemm(isa_, packed_, epi_, xd, I_, N * H * W, yd, O_, bd);
      return y;
    }
    constexpr int64_t kBand = 64;  // output pixels gathered at a time (their rows stay in cache)
    const int64_t Kp = packed_.Kp, taps = geo_.kh * geo_.kw, pixels = OH * OW;
    uint8_t* rows = scratch(size_t(kBand * Kp)).data();
    std::vector<const uint8_t*> ptrs(static_cast<size_t>(taps));
    for (int64_t n = 0; n < N; ++n) {
      const uint8_t* image = xd + n * sN;
      if (strided) {  // copied to NHWC once (a pass in memory order), then gathered as a contiguous image
        thread_local std::vector<uint8_t> nhwc;
        if (nhwc.size() < size_t(H * W * I_)) nhwc.resize(size_t(H * W * I_));
        uint8_t* d = nhwc.data();
        for (int64_t h = 0; h < H; ++h)
          for (int64_t w = 0; w < W; ++w, d += I_) {
            const uint8_t* src = image + h * sH + w * sW;
            for (int64_t c = 0; c < I_; ++c) d[c] = src[c * sC];
          }
        image = nhwc.data();
      }
      for (int64_t p0 = 0; p0 < pixels; p0 += kBand) {
        const int64_t count = std::min(kBand, pixels - p0);
        for (int64_t p = 0, oy = p0 / OW, ox = p0 % OW; p < count; ++p, ox = ox + 1 == OW ? (++oy, 0) : ox + 1)
          gather_row(image, H, W, oy, ox, ptrs.data(), rows + p * Kp);
        gemm(isa_, packed_, epi_, rows, Kp, count, yd + (n * pixels + p0) * O_, O_, bd);
      }
    }
    return y;
  }

  // fully connected: x uint8 [..., I] (a [O, 1, 1, I] filter) -> [..., O]
  at::Tensor run_rows(const at::Tensor& x_in, int64_t lo, int64_t hi) const {
    check(direct_, "run_rows takes a 1x1 filter without stride or padding");
    at::Tensor x = contiguous_u8(x_in, "input");
    check(x.dim() >= 1 && x.size(-1) == I_, "input's last dim must be " + std::to_string(I_));
    std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
    shape.back() = O_;
    at::Tensor y = at::empty(shape, x.options());
    const Bounds bd = call_bounds(lo, hi);
    const uint8_t* xd = x.data_ptr<uint8_t>();
    uint8_t* yd = y.data_ptr<uint8_t>();
    const int64_t M = x.numel() / I_;
    MaybeReleaseGil gil(M * O_ * I_);
    gemm(isa_, packed_, epi_, xd, I_, M, yd, O_, bd);
    return y;
  }

  int isa() const { return isa_; }
  const Bounds& bounds() const { return bounds_; }

 private:
  // One output pixel's im2col row: its taps' channels in filter order, then zeros up to Kp. With unit
  // dilation a kernel row inside the image is one contiguous run of KW * I bytes.
  void gather_row(const uint8_t* image, int64_t H, int64_t W, int64_t oy, int64_t ox, const uint8_t** ptrs,
                  uint8_t* row) const {
    const int64_t ix0 = ox * geo_.sw - geo_.pl, run = geo_.kw * I_;
    if (geo_.dw == 1 && ix0 >= 0 && ix0 + geo_.kw <= W) {
      for (int64_t ky = 0; ky < geo_.kh; ++ky) {
        const int64_t iy = oy * geo_.sh - geo_.pt + ky * geo_.dh;
        if (iy >= 0 && iy < H)
          copy_bytes(row + ky * run, image + (iy * W + ix0) * I_, run);
        else
          copy_bytes(row + ky * run, zeros_.data(), run, true);
      }
    } else {
      tap_pointers(geo_, image, H, W, I_, oy, ox, zeros_.data(), ptrs);
      for (int64_t t = 0; t < geo_.kh * geo_.kw; ++t) copy_bytes(row + t * I_, ptrs[t], I_);
    }
    for (int64_t k = geo_.kh * run; k < packed_.Kp; ++k) row[k] = 0;
  }

  Bounds call_bounds(int64_t lo, int64_t hi) const {
    if (lo < 0 && hi < 0) return bounds_;
    return make_bounds(bounds_.zp, lo, hi);
  }

  int isa_;
  Bounds bounds_;
  int64_t O_ = 0, I_ = 0;
  Geometry geo_{};
  PackedGemm packed_;
  Epilogue epi_;
  std::vector<uint8_t> zeros_;
  bool direct_ = false;
};

// ---------------------------------------------------------------------------------------------------
// Depthwise convolution (channel multiplier 1): per output pixel, each tap's channels times the tap's
// per-channel weights, accumulated in int32. Weights as int32 lanes holding the int16 weight in the low
// half and 0 in the high half, so vpdpwssd / vpmaddwd on a zero-extended activation is the exact product.
// ---------------------------------------------------------------------------------------------------

// Up to NB blocks of 16 channels from channel c (`valid` of them exist); even and odd taps go to separate
// accumulators so the dependent chains are half as long (vpdpwssd's latency, not its throughput, bounds a pixel)
template <int NB>
ETLAB_VNNI inline void dw_blocks_vnni(const uint8_t* const* ptrs, int64_t taps, const int32_t* w, int64_t Cp, int64_t c,
                                      int64_t valid, const int32_t* bias, const float* scale, uint8_t* out,
                                      __m512 fmin, __m512 fmax, __m512i zp) {
  __m512i a[NB], b[NB];
  __mmask16 k[NB];
#pragma GCC unroll 4
  for (int j = 0; j < NB; ++j) {
    const int64_t v = std::min<int64_t>(16, valid - 16 * j);
    k[j] = __mmask16(v >= 16 ? 0xFFFFu : (1u << v) - 1);
    a[j] = _mm512_loadu_si512(bias + c + 16 * j);
    b[j] = _mm512_setzero_si512();
  }
  int64_t t = 0;
  for (; t + 1 < taps; t += 2) {
    const uint8_t *p0 = ptrs[t] + c, *p1 = ptrs[t + 1] + c;
    const int32_t *w0 = w + t * Cp + c, *w1 = w0 + Cp;
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) {
      a[j] = _mm512_dpwssd_epi32(a[j], _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(k[j], p0 + 16 * j)),
                                 _mm512_loadu_si512(w0 + 16 * j));
      b[j] = _mm512_dpwssd_epi32(b[j], _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(k[j], p1 + 16 * j)),
                                 _mm512_loadu_si512(w1 + 16 * j));
    }
  }
  if (t < taps) {
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j)
      a[j] = _mm512_dpwssd_epi32(a[j], _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(k[j], ptrs[t] + c + 16 * j)),
                                 _mm512_loadu_si512(w + t * Cp + c + 16 * j));
  }
#pragma GCC unroll 4
  for (int j = 0; j < NB; ++j)
    store16_vnni(out + c + 16 * j, requant16_vnni(_mm512_add_epi32(a[j], b[j]), scale + c + 16 * j, fmin, fmax, zp),
                 valid - 16 * j);
}

ETLAB_VNNI void dw_pixel_vnni(const uint8_t* const* ptrs, int64_t taps, const int32_t* w, int64_t Cp, int64_t C,
                              const int32_t* bias, const float* scale, uint8_t* out, const Bounds& bd) {
  const __m512 fmin = _mm512_set1_ps(bd.fmin()), fmax = _mm512_set1_ps(bd.fmax());
  const __m512i zp = _mm512_set1_epi32(bd.zp);
  for (int64_t c = 0; c < C; c += 64) {
    const int64_t valid = std::min<int64_t>(64, C - c);
    switch ((valid + 15) / 16) {
      case 4: dw_blocks_vnni<4>(ptrs, taps, w, Cp, c, valid, bias, scale, out, fmin, fmax, zp); break;
      case 3: dw_blocks_vnni<3>(ptrs, taps, w, Cp, c, valid, bias, scale, out, fmin, fmax, zp); break;
      case 2: dw_blocks_vnni<2>(ptrs, taps, w, Cp, c, valid, bias, scale, out, fmin, fmax, zp); break;
      default: dw_blocks_vnni<1>(ptrs, taps, w, Cp, c, valid, bias, scale, out, fmin, fmax, zp); break;
    }
  }
}

ETLAB_AVX2 void dw_pixel_avx2(const uint8_t* const* ptrs, int64_t taps, const int32_t* w, int64_t Cp, int64_t C,
                              const int32_t* bias, const float* scale, uint8_t* out, const Bounds& bd) {
  for (int64_t c = 0; c < C; c += 8) {
    const int64_t valid = std::min<int64_t>(8, C - c);
    __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bias + c));
    for (int64_t t = 0; t < taps; ++t) {
      int64_t bytes = 0;
      if (valid == 8) {
        std::memcpy(&bytes, ptrs[t] + c, 8);
      } else {
        std::memcpy(&bytes, ptrs[t] + c, size_t(valid));
      }
      __m256i x = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(bytes));
      a = _mm256_add_epi32(a, _mm256_madd_epi16(x, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + t * Cp + c))));
    }
    store8_avx2(out + c, a, scale + c, bd, valid);
  }
}

void dw_pixel_scalar(const uint8_t* const* ptrs, int64_t taps, const int32_t* w, int64_t Cp, int64_t C,
                     const int32_t* bias, const float* scale, uint8_t* out, const Bounds& bd) {
  for (int64_t c = 0; c < C; ++c) {
    int32_t acc = bias[c];
    for (int64_t t = 0; t < taps; ++t) acc += int32_t(ptrs[t][c]) * int32_t(int16_t(w[t * Cp + c] & 0xFFFF));
    out[c] = requant_scalar(acc, scale[c], bd);
  }
}

// VNNI form: vpdpbusd multiplies four bytes of a 32-bit lane at once, so each lane is given four taps of one
// channel. Four taps' 64-channel rows are interleaved by unpacking bytes, then 16-bit pairs (within 128-bit
// lanes): Q_r's lane (L, i) holds taps 4q..4q+3 of channel 16L + 4r + i. Weights, bias and scales are packed
// at load in that order, and packing the four requantized vectors (32 -> 16 -> 8 bits, also within 128-bit
// lanes) restores channel order. Taps are padded to a multiple of 4 with the zero point's row and weight 0.
ETLAB_VNNI inline __m512i requant_lanes_vnni(__m512i acc, const float* scale, __m512 fmin, __m512 fmax, __m512i zp) {
  __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(acc), _mm512_loadu_ps(scale));
  f = _mm512_min_ps(_mm512_max_ps(f, fmin), fmax);
  return _mm512_add_epi32(_mm512_cvtps_epi32(f), zp);
}

ETLAB_VNNI void dw_pixel_vnni_quads(const uint8_t* const* ptrs, int64_t quads, const int8_t* wb, const int32_t* bs,
                                    const float* ss, int64_t C, uint8_t* out, const Bounds& bd) {
  const __m512 fmin = _mm512_set1_ps(bd.fmin()), fmax = _mm512_set1_ps(bd.fmax());
  const __m512i zp = _mm512_set1_epi32(bd.zp);
  for (int64_t c = 0, g = 0; c < C; c += 64, ++g) {
    const int64_t valid = std::min<int64_t>(64, C - c);
    const __mmask64 k = valid == 64 ? ~__mmask64(0) : (__mmask64(1) << valid) - 1;
    const int8_t* wg = wb + g * quads * 256;
    __m512i a0 = _mm512_loadu_si512(bs + g * 64), a1 = _mm512_loadu_si512(bs + g * 64 + 16);
    __m512i a2 = _mm512_loadu_si512(bs + g * 64 + 32), a3 = _mm512_loadu_si512(bs + g * 64 + 48);
    for (int64_t q = 0; q < quads; ++q) {
      const uint8_t* const* p = ptrs + 4 * q;
      const __m512i t0 = _mm512_maskz_loadu_epi8(k, p[0] + c), t1 = _mm512_maskz_loadu_epi8(k, p[1] + c);
      const __m512i t2 = _mm512_maskz_loadu_epi8(k, p[2] + c), t3 = _mm512_maskz_loadu_epi8(k, p[3] + c);
      const __m512i lo01 = _mm512_unpacklo_epi8(t0, t1), hi01 = _mm512_unpackhi_epi8(t0, t1);
      const __m512i lo23 = _mm512_unpacklo_epi8(t2, t3), hi23 = _mm512_unpackhi_epi8(t2, t3);
      const int8_t* wq = wg + q * 256;
      a0 = _mm512_dpbusd_epi32(a0, _mm512_unpacklo_epi16(lo01, lo23), _mm512_loadu_si512(wq));
      a1 = _mm512_dpbusd_epi32(a1, _mm512_unpackhi_epi16(lo01, lo23), _mm512_loadu_si512(wq + 64));
      a2 = _mm512_dpbusd_epi32(a2, _mm512_unpacklo_epi16(hi01, hi23), _mm512_loadu_si512(wq + 128));
      a3 = _mm512_dpbusd_epi32(a3, _mm512_unpackhi_epi16(hi01, hi23), _mm512_loadu_si512(wq + 192));
    }
    const float* sg = ss + g * 64;
    const __m512i p01 = _mm512_packs_epi32(requant_lanes_vnni(a0, sg, fmin, fmax, zp),
                                           requant_lanes_vnni(a1, sg + 16, fmin, fmax, zp));
    const __m512i p23 = _mm512_packs_epi32(requant_lanes_vnni(a2, sg + 32, fmin, fmax, zp),
                                           requant_lanes_vnni(a3, sg + 48, fmin, fmax, zp));
    _mm512_mask_storeu_epi8(out + c, k, _mm512_packus_epi16(p01, p23));
  }
}

class QDepthwiseConv2d {
 public:
  // weight: int8 [KH, KW, C] (XNNPACK's [1, KH, KW, C] without the 1); bias int32 [C] or None; scale float32 [C]
  QDepthwiseConv2d(const at::Tensor& weight, const c10::optional<at::Tensor>& bias, const at::Tensor& scale,
                   std::vector<int64_t> pads, std::vector<int64_t> stride, std::vector<int64_t> dilation,
                   int64_t x_zp, int64_t y_zp, int64_t lo, int64_t hi, int64_t isa)
      : isa_(choose_isa(isa)), bounds_(make_bounds(y_zp, lo, hi)) {
    check(weight.scalar_type() == at::kChar && weight.dim() == 3, "weight must be int8 [KH, KW, C]");
    check(0 <= x_zp && x_zp <= 255, "input zero point must be a uint8 value");
    C_ = weight.size(2);
    check(C_ >= 1, "weight must not be empty");
    geo_ = make_geometry(weight.size(0), weight.size(1), pads, stride, dilation);
    taps_ = geo_.kh * geo_.kw;
    Cp_ = round_up(C_, 16);
    at::Tensor wc = weight.contiguous();
    const int8_t* wd = wc.data_ptr<int8_t>();
    w_.assign(size_t(taps_ * Cp_), 0);
    std::vector<int64_t> wsum(size_t(C_), 0);
    for (int64_t t = 0; t < taps_; ++t)
      for (int64_t c = 0; c < C_; ++c) {
        const int8_t v = wd[t * C_ + c];
        w_[size_t(t * Cp_ + c)] = int32_t(uint16_t(int16_t(v)));
        wsum[size_t(c)] += v;
      }
    epi_ = make_epilogue(bias.has_value() ? *bias : at::Tensor(), scale, wsum, C_, x_zp);
    zeros_.assign(size_t(Cp_ + 64), uint8_t(x_zp));
    if (isa_ == kVnni) {  // the packing of dw_pixel_vnni_quads
      const int64_t groups = (C_ + 63) / 64;
      quads_ = (taps_ + 3) / 4;
      wb_.assign(size_t(groups * quads_ * 256), 0);
      bs_.assign(size_t(groups * 64), 0);
      ss_.assign(size_t(groups * 64), 0.f);
      for (int64_t c = 0; c < C_; ++c) {
        // channel c = 64g + 16L + 4r + i sits in lane 4L + i of vector r
        const int64_t g = c / 64, L = (c % 64) / 16, r = (c % 16) / 4, i = c % 4, lane = 4 * L + i;
        for (int64_t t = 0; t < taps_; ++t)
          wb_[size_t(((g * quads_ + t / 4) * 4 + r) * 64 + 4 * lane + t % 4)] = wd[t * C_ + c];
        bs_[size_t(g * 64 + r * 16 + lane)] = epi_.bias[size_t(c)];
        ss_[size_t(g * 64 + r * 16 + lane)] = epi_.scale[size_t(c)];
      }
    }
  }

  at::Tensor run(const at::Tensor& x_in, int64_t lo, int64_t hi) const {
    at::Tensor x = contiguous_u8(x_in, "input");
    check(x.dim() == 4 && x.size(3) == C_, "input must be NHWC with " + std::to_string(C_) + " channels");
    const int64_t N = x.size(0), H = x.size(1), W = x.size(2), OH = geo_.out_h(H), OW = geo_.out_w(W);
    check(OH >= 1 && OW >= 1, "input is smaller than the kernel");
    at::Tensor y = at::empty({N, OH, OW, C_}, x.options());
    const Bounds bd = (lo < 0 && hi < 0) ? bounds_ : make_bounds(bounds_.zp, lo, hi);
    const uint8_t* xd = x.data_ptr<uint8_t>();
    uint8_t* yd = y.data_ptr<uint8_t>();
    MaybeReleaseGil gil(N * OH * OW * C_ * taps_);
    auto pixel = isa_ == kVnni ? dw_pixel_vnni : isa_ == kAvx2 ? dw_pixel_avx2 : dw_pixel_scalar;
    // tap rows, padded to a multiple of 4 with the zero point's row (weight 0) for the VNNI form
    std::vector<const uint8_t*> ptrs(static_cast<size_t>(std::max<int64_t>(taps_, quads_ * 4)), zeros_.data());
    std::vector<int64_t> offsets(static_cast<size_t>(taps_));  // of each tap from the window's corner
    for (int64_t ky = 0, t = 0; ky < geo_.kh; ++ky)
      for (int64_t kx = 0; kx < geo_.kw; ++kx, ++t) offsets[size_t(t)] = (ky * geo_.dh * W + kx * geo_.dw) * C_;
    // output columns whose window lies inside the image's width: [ox_lo, ox_hi)
    const int64_t ox_lo = std::min(OW, (geo_.pl + geo_.sw - 1) / geo_.sw);
    const int64_t span = geo_.dw * (geo_.kw - 1);
    const int64_t ox_hi = std::max(ox_lo, std::min(OW, W - 1 - span + geo_.pl >= 0 ? (W - 1 - span + geo_.pl) / geo_.sw + 1 : 0));
    for (int64_t n = 0; n < N; ++n) {
      const uint8_t* image = xd + n * H * W * C_;
      for (int64_t oy = 0; oy < OH; ++oy) {
        const int64_t iy0 = oy * geo_.sh - geo_.pt;
        const bool rows_inside = iy0 >= 0 && iy0 + geo_.dh * (geo_.kh - 1) < H;
        uint8_t* out_row = yd + (n * OH + oy) * OW * C_;
        for (int64_t ox = 0; ox < OW; ++ox) {
          if (rows_inside && ox >= ox_lo && ox < ox_hi) {
            const uint8_t* corner = image + (iy0 * W + ox * geo_.sw - geo_.pl) * C_;
            for (int64_t t = 0; t < taps_; ++t) ptrs[size_t(t)] = corner + offsets[size_t(t)];
          } else {
            tap_pointers(geo_, image, H, W, C_, oy, ox, zeros_.data(), ptrs.data());
          }
          if (isa_ == kVnni)
            dw_pixel_vnni_quads(ptrs.data(), quads_, wb_.data(), bs_.data(), ss_.data(), C_, out_row + ox * C_, bd);
          else
            pixel(ptrs.data(), taps_, w_.data(), Cp_, C_, epi_.bias.data(), epi_.scale.data(), out_row + ox * C_, bd);
        }
      }
    }
    return y;
  }

  int isa() const { return isa_; }
  const Bounds& bounds() const { return bounds_; }

 private:
  int isa_;
  Bounds bounds_;
  int64_t C_ = 0, Cp_ = 0, taps_ = 0;
  Geometry geo_{};
  std::vector<int32_t> w_;
  Epilogue epi_;
  std::vector<uint8_t> zeros_;
  int64_t quads_ = 0;        // VNNI: taps in fours
  std::vector<int8_t> wb_;   // VNNI: [channel group of 64][tap quad][vector r][lane][tap % 4]
  std::vector<int32_t> bs_;  // VNNI: bias and scales per [group][r][lane]
  std::vector<float> ss_;
};

// ---------------------------------------------------------------------------------------------------
// Add: y = clamp(((a - za) * ma + (b - zb) * mb + rounding) >> shift + zy), the ratios of the input scales
// to the output's as integer multipliers of 2^-shift (the larger one in [2^19, 2^20))
// ---------------------------------------------------------------------------------------------------

ETLAB_VNNI void add_vnni(const uint8_t* a, const uint8_t* b, uint8_t* y, int64_t n, int32_t ma, int32_t mb,
                         int32_t bias, int shift, const Bounds& bd) {
  const __m512i vma = _mm512_set1_epi32(ma), vmb = _mm512_set1_epi32(mb), vbias = _mm512_set1_epi32(bias);
  const __m512i zp = _mm512_set1_epi32(bd.zp), lo = _mm512_set1_epi32(bd.lo), hi = _mm512_set1_epi32(bd.hi);
  const __m128i sh = _mm_cvtsi32_si128(shift);
  for (int64_t i = 0; i < n; i += 16) {
    const int64_t valid = std::min<int64_t>(16, n - i);
    const __mmask16 k = __mmask16(valid >= 16 ? 0xFFFFu : (1u << valid) - 1);
    __m512i va = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(k, a + i));
    __m512i vb = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(k, b + i));
    __m512i acc = _mm512_add_epi32(vbias, _mm512_add_epi32(_mm512_mullo_epi32(va, vma), _mm512_mullo_epi32(vb, vmb)));
    __m512i r = _mm512_add_epi32(_mm512_sra_epi32(acc, sh), zp);
    r = _mm512_min_epi32(_mm512_max_epi32(r, lo), hi);
    store16_vnni(y + i, _mm512_cvtepi32_epi8(r), valid);
  }
}

ETLAB_AVX2 void add_avx2(const uint8_t* a, const uint8_t* b, uint8_t* y, int64_t n, int32_t ma, int32_t mb,
                         int32_t bias, int shift, const Bounds& bd) {
  const __m256i vma = _mm256_set1_epi32(ma), vmb = _mm256_set1_epi32(mb), vbias = _mm256_set1_epi32(bias);
  const __m256i zp = _mm256_set1_epi32(bd.zp), lo = _mm256_set1_epi32(bd.lo), hi = _mm256_set1_epi32(bd.hi);
  const __m128i sh = _mm_cvtsi32_si128(shift);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    int64_t ab, bb;
    std::memcpy(&ab, a + i, 8);
    std::memcpy(&bb, b + i, 8);
    __m256i va = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(ab)), vb = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(bb));
    __m256i acc = _mm256_add_epi32(vbias, _mm256_add_epi32(_mm256_mullo_epi32(va, vma), _mm256_mullo_epi32(vb, vmb)));
    __m256i r = _mm256_add_epi32(_mm256_sra_epi32(acc, sh), zp);
    r = _mm256_min_epi32(_mm256_max_epi32(r, lo), hi);
    __m128i p16 = _mm_packs_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(y + i), _mm_packus_epi16(p16, p16));
  }
  for (; i < n; ++i) {
    int32_t acc = bias + int32_t(a[i]) * ma + int32_t(b[i]) * mb;
    y[i] = uint8_t(std::min(std::max((acc >> shift) + bd.zp, bd.lo), bd.hi));
  }
}

void add_scalar(const uint8_t* a, const uint8_t* b, uint8_t* y, int64_t n, int32_t ma, int32_t mb, int32_t bias,
                int shift, const Bounds& bd) {
  for (int64_t i = 0; i < n; ++i) {
    int32_t acc = bias + int32_t(a[i]) * ma + int32_t(b[i]) * mb;
    y[i] = uint8_t(std::min(std::max((acc >> shift) + bd.zp, bd.lo), bd.hi));
  }
}

class QAdd {
 public:
  // a_ratio, b_ratio: each input's scale over the output's; zero points and bounds in the uint8 form
  QAdd(double a_ratio, int64_t a_zp, double b_ratio, int64_t b_zp, int64_t y_zp, int64_t lo, int64_t hi, int64_t isa)
      : isa_(choose_isa(isa)), bounds_(make_bounds(y_zp, lo, hi)) {
    check(std::isfinite(a_ratio) && std::isfinite(b_ratio) && a_ratio > 0 && b_ratio > 0,
          "scale ratios must be finite and positive");
    check(0 <= a_zp && a_zp <= 255 && 0 <= b_zp && b_zp <= 255, "input zero points must be uint8 values");
    const double largest = std::max(a_ratio, b_ratio);
    int exponent = 0;
    std::frexp(largest, &exponent);  // largest = f * 2^exponent, f in [0.5, 1)
    shift_ = 20 - exponent;          // largest * 2^shift in [2^19, 2^20)
    check(shift_ >= 1 && shift_ <= 30, "scale ratios out of the range an int8 add takes (2^-10 .. 2^18)");
    ma_ = int32_t(std::nearbyint(std::ldexp(a_ratio, shift_)));
    mb_ = int32_t(std::nearbyint(std::ldexp(b_ratio, shift_)));
    const int64_t bias = (int64_t(1) << (shift_ - 1)) - a_zp * ma_ - b_zp * mb_;
    check(bias >= INT32_MIN && bias <= INT32_MAX, "zero points too far apart for the add's accumulator");
    bias_ = int32_t(bias);
  }

  at::Tensor run(const at::Tensor& a_in, const at::Tensor& b_in) const {
    at::Tensor a = contiguous_u8(a_in, "a"), b = contiguous_u8(b_in, "b");
    check(a.sizes() == b.sizes(), "a and b must have the same shape");
    at::Tensor y = at::empty_like(a);
    const uint8_t *ad = a.data_ptr<uint8_t>(), *bd = b.data_ptr<uint8_t>();
    uint8_t* yd = y.data_ptr<uint8_t>();
    const int64_t n = a.numel();
    MaybeReleaseGil gil(n);
    if (isa_ == kVnni)
      add_vnni(ad, bd, yd, n, ma_, mb_, bias_, shift_, bounds_);
    else if (isa_ == kAvx2)
      add_avx2(ad, bd, yd, n, ma_, mb_, bias_, shift_, bounds_);
    else
      add_scalar(ad, bd, yd, n, ma_, mb_, bias_, shift_, bounds_);
    return y;
  }

  int isa() const { return isa_; }

 private:
  int isa_;
  Bounds bounds_;
  int32_t ma_ = 0, mb_ = 0, bias_ = 0;
  int shift_ = 0;
};

// ---------------------------------------------------------------------------------------------------
// Conversions between float values and the shifted integers: q = clamp(round(x * inv_scale) + zp) (round
// half to even, as torch.round) and x = (q - zp) * scale, each one float32 operation as torch computes them.
// ---------------------------------------------------------------------------------------------------

ETLAB_VNNI void quantize_vnni(const float* x, uint8_t* q, int64_t n, float inv, const Bounds& bd) {
  const __m512 vinv = _mm512_set1_ps(inv), fmin = _mm512_set1_ps(bd.fmin()), fmax = _mm512_set1_ps(bd.fmax());
  const __m512i zp = _mm512_set1_epi32(bd.zp);
  for (int64_t i = 0; i < n; i += 16) {
    const int64_t valid = std::min<int64_t>(16, n - i);
    const __mmask16 k = __mmask16(valid >= 16 ? 0xFFFFu : (1u << valid) - 1);
    __m512 f = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + i), vinv);
    f = _mm512_min_ps(_mm512_max_ps(f, fmin), fmax);
    store16_vnni(q + i, _mm512_cvtepi32_epi8(_mm512_add_epi32(_mm512_cvtps_epi32(f), zp)), valid);
  }
}

ETLAB_VNNI void dequantize_vnni(const uint8_t* q, float* x, int64_t n, float scale, int32_t zp) {
  const __m512 vscale = _mm512_set1_ps(scale);
  const __m512i vzp = _mm512_set1_epi32(zp);
  for (int64_t i = 0; i < n; i += 16) {
    const int64_t valid = std::min<int64_t>(16, n - i);
    const __mmask16 k = __mmask16(valid >= 16 ? 0xFFFFu : (1u << valid) - 1);
    __m512i v = _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(k, q + i)), vzp);
    _mm512_mask_storeu_ps(x + i, k, _mm512_mul_ps(_mm512_cvtepi32_ps(v), vscale));
  }
}

at::Tensor quantize_u8(const at::Tensor& x_in, double inv_scale, int64_t zp, int64_t lo, int64_t hi, int64_t isa) {
  check(x_in.scalar_type() == at::kFloat, "x must be float32");
  const Bounds bd = make_bounds(zp, lo, hi);
  const int use = choose_isa(isa);
  // a dense tensor in any dimension order (a permuted view) is converted in memory order, its strides kept
  at::Tensor x = x_in.is_non_overlapping_and_dense() ? x_in : x_in.contiguous();
  at::Tensor q = at::empty_like(x, x.options().dtype(at::kByte));
  const float* xd = x.data_ptr<float>();
  uint8_t* qd = q.data_ptr<uint8_t>();
  const int64_t n = x.numel();
  const float inv = float(inv_scale);
  MaybeReleaseGil gil(n);
  if (use == kVnni) {
    quantize_vnni(xd, qd, n, inv, bd);
  } else {
    for (int64_t i = 0; i < n; ++i) qd[i] = requant_scalar_f(xd[i] * inv, bd);
  }
  return q;
}

at::Tensor dequantize_u8(const at::Tensor& q_in, double scale, int64_t zp, int64_t isa) {
  at::Tensor q = q_in.is_non_overlapping_and_dense() && q_in.scalar_type() == at::kByte ? q_in
                                                                                         : contiguous_u8(q_in, "q");
  check(0 <= zp && zp <= 255, "zero point must be a uint8 value");
  const int use = choose_isa(isa);
  at::Tensor x = at::empty_like(q, q.options().dtype(at::kFloat));  // q's strides (see quantize_u8)
  const uint8_t* qd = q.data_ptr<uint8_t>();
  float* xd = x.data_ptr<float>();
  const int64_t n = q.numel();
  const float s = float(scale);
  MaybeReleaseGil gil(n);
  if (use == kVnni) {
    dequantize_vnni(qd, xd, n, s, int32_t(zp));
  } else {
    for (int64_t i = 0; i < n; ++i) xd[i] = float(int32_t(qd[i]) - int32_t(zp)) * s;
  }
  return x;
}

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

}  // namespace

void bind_int8_kernels(pybind11::module_& m) {
  using py::arg;
  m.def("int8_isa", [](int64_t requested) { return choose_isa(requested); }, arg("requested") = -1,
        "The int8 kernels' instruction set for an object made now: 0 scalar, 1 AVX2, 2 AVX-512 VNNI");
  m.def("quantize_u8", &quantize_u8, arg("x"), arg("inv_scale"), arg("zp"), arg("lo"), arg("hi"), arg("isa") = -1,
        "uint8 clamp(round(x * inv_scale) + zp, lo, hi) of a float32 tensor (contiguous, x's shape)");
  m.def("dequantize_u8", &dequantize_u8, arg("q"), arg("scale"), arg("zp"), arg("isa") = -1,
        "float32 (q - zp) * scale of a uint8 tensor (contiguous, q's shape)");
  bind_bound<QConv2d>(m, "BoundQConv2d");
  bind_bound<QDepthwiseConv2d>(m, "BoundQDepthwiseConv2d");
  py::class_<QConv2d, std::shared_ptr<QConv2d>>(m, "QConv2d")
      .def(py::init<const at::Tensor&, const c10::optional<at::Tensor>&, const at::Tensor&, std::vector<int64_t>,
                    std::vector<int64_t>, std::vector<int64_t>, int64_t, int64_t, int64_t, int64_t, int64_t>(),
           arg("weight"), arg("bias"), arg("scale"), arg("pads"), arg("stride"), arg("dilation"), arg("x_zp"),
           arg("y_zp"), arg("lo"), arg("hi"), arg("isa") = -1)
      .def("run", &QConv2d::run, arg("x"), arg("lo") = -1, arg("hi") = -1)
      .def("run_rows", &QConv2d::run_rows, arg("x"), arg("lo") = -1, arg("hi") = -1)
      .def("bound", [](const std::shared_ptr<QConv2d>& k, bool rows) { return bound(k, rows); }, arg("rows") = false,
           "A callable of the input alone (run, or run_rows with rows=True) with .clamped(lo, hi)")
      .def_property_readonly("isa", &QConv2d::isa);
  py::class_<QDepthwiseConv2d, std::shared_ptr<QDepthwiseConv2d>>(m, "QDepthwiseConv2d")
      .def(py::init<const at::Tensor&, const c10::optional<at::Tensor>&, const at::Tensor&, std::vector<int64_t>,
                    std::vector<int64_t>, std::vector<int64_t>, int64_t, int64_t, int64_t, int64_t, int64_t>(),
           arg("weight"), arg("bias"), arg("scale"), arg("pads"), arg("stride"), arg("dilation"), arg("x_zp"),
           arg("y_zp"), arg("lo"), arg("hi"), arg("isa") = -1)
      .def("run", &QDepthwiseConv2d::run, arg("x"), arg("lo") = -1, arg("hi") = -1)
      .def("bound", [](const std::shared_ptr<QDepthwiseConv2d>& k) { return bound(k, false); },
           "A callable of the input alone with .clamped(lo, hi)")
      .def_property_readonly("isa", &QDepthwiseConv2d::isa);
  py::class_<QAdd>(m, "QAdd")
      .def(py::init<double, int64_t, double, int64_t, int64_t, int64_t, int64_t, int64_t>(), arg("a_ratio"),
           arg("a_zp"), arg("b_ratio"), arg("b_zp"), arg("y_zp"), arg("lo"), arg("hi"), arg("isa") = -1)
      .def("run", &QAdd::run, arg("a"), arg("b"))
      .def("__call__", &QAdd::run, arg("a"), arg("b"))
      .def_property_readonly("isa", &QAdd::isa);
}

}  // namespace etlab_native
