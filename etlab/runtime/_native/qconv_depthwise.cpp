// The int8 depthwise convolution (QDepthwiseConv2d, channel multiplier 1) in its AVX-512 VNNI, AVX2 and scalar
// forms. Split from qconv.cpp to keep files small; the shared helpers are in qconv_internal.h.
#include "qconv_internal.h"

namespace etlab_native {
namespace int8 __attribute__((visibility("hidden"))) {

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
    at::Tensor y = output_.get({N, OH, OW, C_}, x.options());
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
  OutputCache output_;  // the last result, handed out again once nothing holds it (conv.h)
  int64_t quads_ = 0;        // VNNI: taps in fours
  std::vector<int8_t> wb_;   // VNNI: [channel group of 64][tap quad][vector r][lane][tap % 4]
  std::vector<int32_t> bs_;  // VNNI: bias and scales per [group][r][lane]
  std::vector<float> ss_;
};

UnaryFn bound_qdepthwise_fn(py::handle obj) {
  if (!py::isinstance<Bound<QDepthwiseConv2d>>(obj)) return {};
  return [k = obj.cast<Bound<QDepthwiseConv2d>>()](const at::Tensor& x) { return k(x); };
}

void bind_int8_depthwise(py::module_& m) {
  using py::arg;
  bind_bound<QDepthwiseConv2d>(m, "BoundQDepthwiseConv2d");
  py::class_<QDepthwiseConv2d, std::shared_ptr<QDepthwiseConv2d>>(m, "QDepthwiseConv2d")
      .def(py::init<const at::Tensor&, const c10::optional<at::Tensor>&, const at::Tensor&, std::vector<int64_t>,
                    std::vector<int64_t>, std::vector<int64_t>, int64_t, int64_t, int64_t, int64_t, int64_t>(),
           arg("weight"), arg("bias"), arg("scale"), arg("pads"), arg("stride"), arg("dilation"), arg("x_zp"),
           arg("y_zp"), arg("lo"), arg("hi"), arg("isa") = -1)
      .def("run", &QDepthwiseConv2d::run, arg("x"), arg("lo") = -1, arg("hi") = -1)
      .def("bound", [](const std::shared_ptr<QDepthwiseConv2d>& k) { return bound(k, false); },
           "A callable of the input alone with .clamped(lo, hi)")
      .def_property_readonly("isa", &QDepthwiseConv2d::isa);
}

}  // namespace int8
}  // namespace etlab_native
