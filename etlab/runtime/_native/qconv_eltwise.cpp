// Element-wise int8 kernels: the quantized add (QAdd) and the float <-> uint8-shifted conversions
// (quantize_u8, dequantize_u8). Split from qconv.cpp to keep files small; shared helpers in qconv_internal.h.
#include "qconv_internal.h"

namespace etlab_native {
namespace int8 __attribute__((visibility("hidden"))) {

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

BinaryFn qadd_fn(py::handle obj) {
  if (!py::isinstance<QAdd>(obj)) return {};
  return [k = obj.cast<QAdd>()](const at::Tensor& a, const at::Tensor& b) { return k.run(a, b); };
}

void bind_int8_eltwise(py::module_& m) {
  using py::arg;
  m.def("quantize_u8", &quantize_u8, arg("x"), arg("inv_scale"), arg("zp"), arg("lo"), arg("hi"), arg("isa") = -1,
        "uint8 clamp(round(x * inv_scale) + zp, lo, hi) of a float32 tensor (contiguous, x's shape)");
  m.def("dequantize_u8", &dequantize_u8, arg("q"), arg("scale"), arg("zp"), arg("isa") = -1,
        "float32 (q - zp) * scale of a uint8 tensor (contiguous, q's shape)");
  py::class_<QAdd>(m, "QAdd")
      .def(py::init<double, int64_t, double, int64_t, int64_t, int64_t, int64_t, int64_t>(), arg("a_ratio"),
           arg("a_zp"), arg("b_ratio"), arg("b_zp"), arg("y_zp"), arg("lo"), arg("hi"), arg("isa") = -1)
      .def("run", &QAdd::run, arg("a"), arg("b"))
      .def("__call__", &QAdd::run, arg("a"), arg("b"))
      .def_property_readonly("isa", &QAdd::isa);
}

}  // namespace int8
}  // namespace etlab_native
