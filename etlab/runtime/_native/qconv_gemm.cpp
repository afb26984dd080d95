// The int8 GEMM (AVX-512 VNNI, AVX2 and scalar forms) and the kernels built on it: dense convolution
// (QConv2d, groups 1, including 1x1 and im2col) and fully connected layers (QConv2d.run_rows). Split from
// qconv.cpp to keep files small; the shared helpers are in qconv_internal.h.
#include "qconv_internal.h"

namespace etlab_native {
namespace int8 __attribute__((visibility("hidden"))) {

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
    at::Tensor y = output_.get({N, OH, OW, O_}, x.options());
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
    at::Tensor y = output_.get(shape, x.options());
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
  OutputCache output_;  // the last result, handed out again once nothing holds it (conv.h)
  bool direct_ = false;
};

UnaryFn bound_qconv_fn(py::handle obj) {
  if (!py::isinstance<Bound<QConv2d>>(obj)) return {};
  return [k = obj.cast<Bound<QConv2d>>()](const at::Tensor& x) { return k(x); };
}

void bind_int8_gemm(py::module_& m) {
  using py::arg;
  bind_bound<QConv2d>(m, "BoundQConv2d");
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
}

}  // namespace int8
}  // namespace etlab_native
