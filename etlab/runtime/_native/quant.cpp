// Native kernels of the quantize/dequantize out-variants a quantized .pte calls
// (quantized_decomposed::{quantize,dequantize}_per_{tensor,channel}), registered as operators of
// the private namespace etlab_native so the native core calls them like any ATen kernel, without
// Python. _native/_plan.py binds an instruction to them only where they are bit-identical to the
// Python kernels of etlab/runtime/_quant_kernels.py, which follow torch's reference step for step:
//   quantize:   out = clamp(round(float(x) * float(1 / scale)) + zero_point, quant_min, quant_max) as Q
//   dequantize: out = (T(q) - zero_point) * scale  (every step rounded to T, as torch's in-place ops)
// Each rounding torch makes between its steps (the float32 product, the store into a half output
// after the subtraction, the promotion of per-channel qparams to float64) is made here too, in one
// pass over the data and with no temporaries. Every argument may come from a hostile file, so every
// call checks dtypes, ranges, shapes and the qparams it reads (c10::ValueError, which the core
// reports naming the instruction).
#include <ATen/Parallel.h>
#include <ATen/TensorIterator.h>
#include <torch/library.h>

#include <algorithm>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif
#include <optional>
#include <vector>

#include "quant.h"

namespace etlab_native {
namespace {

using namespace quant;

constexpr int64_t kGrain = at::internal::GRAIN_SIZE;  // elements per parallel task, as ATen's loops

// -- loops over contiguous runs ---------------------------------------------------------------------

#if defined(__x86_64__) && defined(__GNUC__)
#define ETLAB_AVX2 1
// The float32 loops 8 lanes at a time with AVX2, on CPUs that have it (the rest, and other CPUs, one
// by one). The same IEEE operations as the scalar code: vroundps to nearest-even is nearbyint;
// vmaxps(lo, v) is `lo > v ? lo : v` and vminps(hi, v) `hi < v ? hi : v`, so nan stays nan as in
// quantize_one; vcvttps2dq is the x86 cast (nan -> INT32_MIN), then truncated to Q. AVX2 alone, no
// FMA: nothing can fuse a multiply and an add.
const bool kAvx2 = [] {
  __builtin_cpu_init();  // this initializer may run before libgcc's own
  return __builtin_cpu_supports("avx2") != 0;
}();

// The low sizeof(Q) bytes of each 32-bit lane of n, stored as 8 Qs.
template <class Q>
__attribute__((target("avx2"))) inline void store_truncated(__m256i n, Q* out) {
  if constexpr (sizeof(Q) == 4) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), n);
  } else if constexpr (sizeof(Q) == 2) {
    const __m256i pick = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1,
                                          0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(n, pick), 0x08);  // qwords 0, 2
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm256_castsi256_si128(packed));
  } else {
    const __m256i pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                          0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m256i packed = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(n, pick),
                                                       _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out), _mm256_castsi256_si128(packed));
  }
}

template <class Q>
__attribute__((target("avx2"))) int64_t quantize_floats_avx2(const float* x, int64_t n, float inv_scale,
                                                             float zero_point, bool add_zero_point, float lo,
                                                             float hi, Q* out) {
  const __m256 inv = _mm256_set1_ps(inv_scale), zp = _mm256_set1_ps(zero_point);
  const __m256 vlo = _mm256_set1_ps(lo), vhi = _mm256_set1_ps(hi);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), inv),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    if (add_zero_point) v = _mm256_add_ps(v, zp);
    v = _mm256_min_ps(vhi, _mm256_max_ps(vlo, v));
    store_truncated(_mm256_cvttps_epi32(v), out + i);
  }
  return i;
}

template <class Q>
__attribute__((target("avx2"))) int64_t dequantize_floats_avx2(const Q* q, int64_t n, float zero_point,
                                                               bool sub_zero_point, float scale, float* out) {
  const __m256 zp = _mm256_set1_ps(zero_point), s = _mm256_set1_ps(scale);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256i w;
    if constexpr (std::is_same_v<Q, int8_t>) {
      w = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + i)));
    } else if constexpr (std::is_same_v<Q, uint8_t>) {
      w = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + i)));
    } else if constexpr (std::is_same_v<Q, int16_t>) {
      w = _mm256_cvtepi16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + i)));
    } else {
      w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + i));
    }
    __m256 f = _mm256_cvtepi32_ps(w);
    if (sub_zero_point) f = _mm256_sub_ps(f, zp);
    _mm256_storeu_ps(out + i, _mm256_mul_ps(f, s));
  }
  return i;
}
#endif

template <class Q>
void quantize_floats(const float* x, int64_t n, float inv_scale, float zero_point, bool add_zero_point, float lo,
                     float hi, Q* out) {
  int64_t i = 0;
#if defined(ETLAB_AVX2)
  if (kAvx2) i = quantize_floats_avx2(x, n, inv_scale, zero_point, add_zero_point, lo, hi, out);
#endif
  for (; i < n; ++i) out[i] = quantize_one<Q>(x[i], inv_scale, zero_point, add_zero_point, lo, hi);
}

// Float16/bfloat16 inputs are converted to float32 first (x.to(torch.float32)), a block at a time.
template <class X, class Q>
void quantize_run(const X* x, int64_t n, float inv_scale, float zero_point, bool add_zero_point, float lo, float hi,
                  Q* out) {
  if constexpr (std::is_same_v<X, float>) {
    quantize_floats(x, n, inv_scale, zero_point, add_zero_point, lo, hi, out);
  } else {
    constexpr int64_t kBlock = 256;
    float buf[kBlock];
    for (int64_t i = 0; i < n; i += kBlock) {
      const int64_t m = std::min(kBlock, n - i);
      for (int64_t k = 0; k < m; ++k) buf[k] = static_cast<float>(x[i + k]);
      quantize_floats(buf, m, inv_scale, zero_point, add_zero_point, lo, hi, out + i);
    }
  }
}

// Per-channel scales in float64: the input is promoted to float64 and every step is in float64.
template <class X, class Q>
void quantize_run(const X* x, int64_t n, double inv_scale, double zero_point, bool add_zero_point, double lo,
                  double hi, Q* out) {
  for (int64_t i = 0; i < n; ++i)
    out[i] = quantize_one<Q, double>(static_cast<double>(static_cast<float>(x[i])), inv_scale, zero_point,
                                     add_zero_point, lo, hi);
}

template <class T, class D, class Q>
void dequantize_run(const Q* q, int64_t n, Opmath<T> zero_point, bool sub_zero_point, D scale, T* out) {
  int64_t i = 0;
#if defined(ETLAB_AVX2)
  if constexpr (std::is_same_v<T, float> && std::is_same_v<D, float>) {
    if (kAvx2) i = dequantize_floats_avx2(q, n, zero_point, sub_zero_point, scale, out);
  }
#endif
  for (; i < n; ++i) out[i] = dequantize_one<T, D>(q[i], zero_point, sub_zero_point, scale);
}

// The .Tensor overloads' qparams: one-element tensors read on every call (their values may change).
double scale_value(const at::Tensor& s) {
  TORCH_CHECK_VALUE(s.numel() == 1 && at::isFloatingType(s.scalar_type()),
                    "scale must be a one-element floating tensor, got ", dtype_name(s.scalar_type()),
                    " of shape ", shape_of(s));
  double v = 0;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, s.scalar_type(), "scale_value", [&] {
    v = static_cast<double>(*s.const_data_ptr<scalar_t>());
  });
  check_scale(v);
  return v;
}

int64_t zero_point_value(const at::Tensor& z) {
  TORCH_CHECK_VALUE(z.numel() == 1 && at::isIntegralType(z.scalar_type(), /*includeBool=*/false),
                    "zero_point must be a one-element integer tensor, got ", dtype_name(z.scalar_type()),
                    " of shape ", shape_of(z));
  int64_t v = 0;
  AT_DISPATCH_INTEGRAL_TYPES(z.scalar_type(), "zero_point_value", [&] {
    v = static_cast<int64_t>(*z.const_data_ptr<scalar_t>());
  });
  return v;
}

// -- layout -------------------------------------------------------------------------------------------

// out gets x's sizes within its own memory, contiguous (_memory.reshape_in_place; set_ fails past the
// storage's end, as it does there).
void fit_out(at::Tensor& out, const at::Tensor& x) {
  if (out.sizes() == x.sizes()) return;
  std::vector<int64_t> strides(static_cast<size_t>(x.dim()));
  int64_t stride = 1;
  for (int64_t d = x.dim() - 1; d >= 0; --d) {
    strides[static_cast<size_t>(d)] = stride;
    stride *= std::max<int64_t>(x.size(d), 1);
  }
  out.set_(out.storage(), out.storage_offset(), x.sizes(), strides);
}

bool overlap(const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0) return false;
  const auto* a0 = static_cast<const char*>(a.const_data_ptr());
  const auto* b0 = static_cast<const char*>(b.const_data_ptr());
  return a0 < b0 + b.numel() * b.element_size() && b0 < a0 + a.numel() * a.element_size();
}

// Runs body(input, output) on operands it may walk as flat arrays of the same layout (dense, equal
// strides, `contiguous` if asked, disjoint memory): x and out themselves when they are, else a
// contiguous copy of x and a fresh output then copied into out (the Python kernels compute into
// temporaries too, so overlapping operands give the same result).
template <class Body>
void with_flat(const at::Tensor& x, at::Tensor& out, bool contiguous, Body&& body) {
  TORCH_CHECK_VALUE(out.sizes() == x.sizes(), "out has shape ", shape_of(out), ", the input ", shape_of(x));
  const bool flat = x.strides() == out.strides() && x.is_non_overlapping_and_dense() &&
                    (!contiguous || x.is_contiguous()) && !overlap(x, out);
  if (flat) return body(x, out);
  at::Tensor tmp = at::empty(x.sizes(), out.options());
  body(x.contiguous(), tmp);
  out.copy_(tmp);
}

// -- the operators ------------------------------------------------------------------------------------

void quantize_per_tensor(const at::Tensor& x, double scale, int64_t zero_point, int64_t qmin, int64_t qmax,
                         at::Tensor& out) {
  check_range(qmin, qmax, out.scalar_type());
  check_scale(scale);
  const float inv = static_cast<float>(1.0 / scale);  // 1.0 / scale in float64, then a float32 multiplier
  const float zp = static_cast<float>(zero_point), lo = static_cast<float>(qmin), hi = static_cast<float>(qmax);
  with_float_input(x.scalar_type(), "quantize_per_tensor", [&](auto xt) {
    using X = decltype(xt);
    fit_out(out, x);
    with_flat(x, out, false, [&](const at::Tensor& src, at::Tensor& dst) {
      with_q(dst.scalar_type(), [&](auto qt) {
        using Q = decltype(qt);
        const X* xp = src.const_data_ptr<X>();
        Q* op = dst.mutable_data_ptr<Q>();
        at::parallel_for(0, src.numel(), kGrain, [&](int64_t b, int64_t e) {
          quantize_run(xp + b, e - b, inv, zp, zero_point != 0, lo, hi, op + b);
        });
      });
    });
  });
}

void dequantize_per_tensor(const at::Tensor& x, double scale, int64_t zero_point, int64_t qmin, int64_t qmax,
                           at::Tensor& out) {
  check_range(qmin, qmax, x.scalar_type());
  check_scale(scale);
  with_float_output(out.scalar_type(), "dequantize_per_tensor", [&](auto tt) {
    using T = decltype(tt);
    using O = Opmath<T>;
    const O zp = static_cast<O>(zero_point), s = static_cast<O>(scale);
    fit_out(out, x);
    with_flat(x, out, false, [&](const at::Tensor& src, at::Tensor& dst) {
      with_q(src.scalar_type(), [&](auto qt) {
        using Q = decltype(qt);
        const Q* qp = src.const_data_ptr<Q>();
        T* op = dst.mutable_data_ptr<T>();
        at::parallel_for(0, src.numel(), kGrain, [&](int64_t b, int64_t e) {
          dequantize_run<T, O>(qp + b, e - b, zp, zero_point != 0, s, op + b);
        });
      });
    });
  });
}

// -- per channel --------------------------------------------------------------------------------------

struct Channels {
  int64_t outer, count, inner;  // x viewed as [outer, count, inner]
};

Channels channels_of(const at::Tensor& x, int64_t axis, const at::Tensor& scales,
                     const std::optional<at::Tensor>& zero_points, const char* what) {
  TORCH_CHECK_VALUE(-x.dim() <= axis && axis < x.dim(), what, ": axis ", axis, " is out of range for a ", x.dim(),
                    "-d input");
  if (axis < 0) axis += x.dim();
  Channels c{1, x.size(axis), 1};
  for (int64_t d = 0; d < axis; ++d) c.outer *= x.size(d);
  for (int64_t d = axis + 1; d < x.dim(); ++d) c.inner *= x.size(d);
  TORCH_CHECK_VALUE(scales.dim() == 1 && scales.numel() == c.count && at::isFloatingType(scales.scalar_type()), what,
                    ": scales must be a 1-d floating tensor of ", c.count, " elements (the input's size on axis ",
                    axis, "), got ", dtype_name(scales.scalar_type()), " of shape ", shape_of(scales));
  if (zero_points) {
    const at::Tensor& z = *zero_points;
    TORCH_CHECK_VALUE(z.dim() == 1 && z.numel() == c.count && at::isIntegralType(z.scalar_type(), false), what,
                      ": zero_points must be a 1-d integer tensor of ", c.count, " elements, got ",
                      dtype_name(z.scalar_type()), " of shape ", shape_of(z));
  }
  return c;
}

// A 1-d tensor's values converted to V (c10::convert, torch's casts), read through its stride.
template <class V>
std::vector<V> values_as(const at::Tensor& t) {
  std::vector<V> out(static_cast<size_t>(t.numel()));
  AT_DISPATCH_ALL_TYPES_AND2(at::kHalf, at::kBFloat16, t.scalar_type(), "values_as", [&] {
    const scalar_t* p = t.const_data_ptr<scalar_t>();
    for (int64_t i = 0; i < t.numel(); ++i) out[static_cast<size_t>(i)] = c10::convert<V>(p[i * t.stride(0)]);
  });
  return out;
}

// Runs row(r, channel) over the [outer * count] rows of `inner` elements, in parallel.
template <class Row>
void for_rows(const Channels& c, Row&& row) {
  const int64_t grain = std::max<int64_t>(1, kGrain / std::max<int64_t>(c.inner, 1));
  at::parallel_for(0, c.outer * c.count, grain, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) row(r, r % c.count);
  });
}

void quantize_per_channel(const at::Tensor& x, const at::Tensor& scales, const at::Tensor& zero_points, int64_t axis,
                          int64_t qmin, int64_t qmax, at::Tensor& out) {
  const char* what = "quantize_per_channel";
  check_range(qmin, qmax, out.scalar_type());
  const Channels c = channels_of(x, axis, scales, zero_points, what);
  with_float_input(x.scalar_type(), what, [&](auto xt) {
    using X = decltype(xt);
    with_scales(scales.scalar_type(), what, [&](auto st) {
      using C = decltype(st);  // x * (1.0 / scales) is computed in the promotion of float32 and the scales' dtype
      std::vector<C> inv = values_as<C>(scales);
      for (C& v : inv) v = C(1) / v;  // scales.reciprocal()
      const std::vector<C> zp = values_as<C>(zero_points);
      const C lo = static_cast<C>(qmin), hi = static_cast<C>(qmax);
      with_flat(x, out, true, [&](const at::Tensor& src, at::Tensor& dst) {
        with_q(dst.scalar_type(), [&](auto qt) {
          using Q = decltype(qt);
          const X* xp = src.const_data_ptr<X>();
          Q* op = dst.mutable_data_ptr<Q>();
          for_rows(c, [&](int64_t r, int64_t ch) {
            quantize_run(xp + r * c.inner, c.inner, inv[ch], zp[ch], true, lo, hi, op + r * c.inner);
          });
        });
      });
    });
  });
}

void dequantize_per_channel(const at::Tensor& x, const at::Tensor& scales, const std::optional<at::Tensor>& zero_points,
                            int64_t axis, int64_t qmin, int64_t qmax, at::Tensor& out) {
  const char* what = "dequantize_per_channel";
  check_range(qmin, qmax, x.scalar_type());
  const Channels c = channels_of(x, axis, scales, zero_points, what);
  with_float_output(out.scalar_type(), what, [&](auto tt) {
    using T = decltype(tt);
    with_scales(scales.scalar_type(), what, [&](auto st) {
      // out.mul_(scales): computed in the promotion of T and the scales' dtype.
      using D = std::conditional_t<std::is_same_v<T, double> || std::is_same_v<decltype(st), double>, double, float>;
      const std::vector<D> s = values_as<D>(scales);
      std::vector<Opmath<T>> zp(static_cast<size_t>(c.count), 0);
      if (zero_points) {  // out.sub_(zero_points): the zero points are cast to T first
        const std::vector<T> z = values_as<T>(*zero_points);
        for (size_t k = 0; k < z.size(); ++k) zp[k] = static_cast<Opmath<T>>(z[k]);
      }
      with_flat(x, out, true, [&](const at::Tensor& src, at::Tensor& dst) {
        with_q(src.scalar_type(), [&](auto qt) {
          using Q = decltype(qt);
          const Q* qp = src.const_data_ptr<Q>();
          T* op = dst.mutable_data_ptr<T>();
          for_rows(c, [&](int64_t r, int64_t ch) {
            dequantize_run<T, D>(qp + r * c.inner, c.inner, zp[ch], zero_points.has_value(), s[ch], op + r * c.inner);
          });
        });
      });
    });
  });
}

// -- boxed signatures of the schemas below ------------------------------------------------------------------

at::Tensor& quantize_per_tensor_out(const at::Tensor& x, double scale, int64_t zero_point, int64_t qmin, int64_t qmax,
                                    at::Tensor& out) {
  quantize_per_tensor(x, scale, zero_point, qmin, qmax, out);
  return out;
}

at::Tensor& quantize_per_tensor_tensor_out(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& zero_point,
                                           int64_t qmin, int64_t qmax, at::Tensor& out) {
  quantize_per_tensor(x, scale_value(scale), zero_point_value(zero_point), qmin, qmax, out);
  return out;
}

at::Tensor& dequantize_per_tensor_out(const at::Tensor& x, double scale, int64_t zero_point, int64_t qmin,
                                      int64_t qmax, at::Tensor& out) {
  dequantize_per_tensor(x, scale, zero_point, qmin, qmax, out);
  return out;
}

at::Tensor& dequantize_per_tensor_tensor_out(const at::Tensor& x, const at::Tensor& scale,
                                             const at::Tensor& zero_point, int64_t qmin, int64_t qmax,
                                             at::Tensor& out) {
  dequantize_per_tensor(x, scale_value(scale), zero_point_value(zero_point), qmin, qmax, out);
  return out;
}

at::Tensor& quantize_per_channel_out(const at::Tensor& x, const at::Tensor& scales, const at::Tensor& zero_points,
                                     int64_t axis, int64_t qmin, int64_t qmax, at::Tensor& out) {
  quantize_per_channel(x, scales, zero_points, axis, qmin, qmax, out);
  return out;
}

at::Tensor& dequantize_per_channel_out(const at::Tensor& x, const at::Tensor& scales,
                                       const std::optional<at::Tensor>& zero_points, int64_t axis, int64_t qmin,
                                       int64_t qmax, at::Tensor& out) {
  dequantize_per_channel(x, scales, zero_points, axis, qmin, qmax, out);
  return out;
}

}  // namespace
}  // namespace etlab_native

// The output dtype is out's (checked against the call's dtype at load by _quant_kernels). choose_qparams'
// kernel is in quant_choose.cpp.
TORCH_LIBRARY(etlab_native, m) {
  m.def("quantize_per_tensor.out(Tensor input, float scale, int zero_point, int quant_min, int quant_max, *, "
        "Tensor(a!) out) -> Tensor(a!)");
  m.def("quantize_per_tensor.tensor_out(Tensor input, Tensor scale, Tensor zero_point, int quant_min, "
        "int quant_max, *, Tensor(a!) out) -> Tensor(a!)");
  m.def("dequantize_per_tensor.out(Tensor input, float scale, int zero_point, int quant_min, int quant_max, *, "
        "Tensor(a!) out) -> Tensor(a!)");
  m.def("dequantize_per_tensor.tensor_out(Tensor input, Tensor scale, Tensor zero_point, int quant_min, "
        "int quant_max, *, Tensor(a!) out) -> Tensor(a!)");
  m.def("quantize_per_channel.out(Tensor input, Tensor scales, Tensor zero_points, int axis, int quant_min, "
        "int quant_max, *, Tensor(a!) out) -> Tensor(a!)");
  m.def("dequantize_per_channel.out(Tensor input, Tensor scales, Tensor? zero_points, int axis, int quant_min, "
        "int quant_max, *, Tensor(a!) out) -> Tensor(a!)");
  m.def("choose_qparams.tensor_out(Tensor input, int quant_min, int quant_max, float eps, *, Tensor(a!) scale_out, "
        "Tensor(b!) zero_point_out) -> (Tensor(a!), Tensor(b!))");
}

TORCH_LIBRARY_IMPL(etlab_native, CPU, m) {
  using namespace etlab_native;
  m.impl("quantize_per_tensor.out", &quantize_per_tensor_out);
  m.impl("quantize_per_tensor.tensor_out", &quantize_per_tensor_tensor_out);
  m.impl("dequantize_per_tensor.out", &dequantize_per_tensor_out);
  m.impl("dequantize_per_tensor.tensor_out", &dequantize_per_tensor_tensor_out);
  m.impl("quantize_per_channel.out", &quantize_per_channel_out);
  m.impl("dequantize_per_channel.out", &dequantize_per_channel_out);
}
