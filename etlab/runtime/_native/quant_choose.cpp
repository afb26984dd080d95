// The native kernel of choose_qparams.Tensor_out (dynamic quantization's per-tensor qparams from each
// input), registered as etlab_native::choose_qparams.tensor_out (declared in quant.cpp) and bound by
// _native/_plan.py; bit-identical to the Python kernel of etlab/runtime/_quant_kernels.py, which calls
// torch's reference.
#include <torch/library.h>

#include <algorithm>
#include <tuple>
#include <utility>

#include "quant.h"

namespace etlab_native {
namespace {

using namespace quant;

// torch.aminmax: the smallest and largest value, nan if there is one (as floats: exact for every X).
template <class X>
std::pair<float, float> min_max(const X* x, int64_t n) {
  float lo = static_cast<float>(x[0]), hi = lo;
  bool nan = false;
  for (int64_t i = 0; i < n; ++i) {
    const float v = static_cast<float>(x[i]);
    nan |= v != v;
    lo = v < lo ? v : lo;
    hi = v > hi ? v : hi;
  }
  if (nan) lo = hi = std::numeric_limits<float>::quiet_NaN();
  return {lo, hi};
}

// torch.min/max of two values: nan if either is.
inline float nan_min(float a, float b) {
  return (a != a || b != b) ? std::numeric_limits<float>::quiet_NaN() : std::min(a, b);
}
inline float nan_max(float a, float b) {
  return (a != a || b != b) ? std::numeric_limits<float>::quiet_NaN() : std::max(a, b);
}

// choose_qparams.Tensor_out: torch's reference (aminmax, then utils.determine_qparams for a per-tensor
// affine scheme) step for step: min(min, 0) and max(max, 0) and their difference in X (rounded to X, as
// its 0-d tensors are), that divided by float(quant_max - quant_min) in X, the larger of it and eps
// (a float32 tensor) in float32; zero_point = clamp(quant_min - int32(round(min_neg / scale)), quant_min,
// quant_max) in int32 (the subtraction wraps as int32 tensors do); then scale as float64 and zero_point as
// int64 copied into the outputs.
void choose_qparams(const at::Tensor& x, int64_t qmin, int64_t qmax, double eps, at::Tensor& scale_out,
                    at::Tensor& zero_point_out) {
  TORCH_CHECK_VALUE(qmin <= 0 && 0 <= qmax && qmin < qmax && qmin >= INT32_MIN && qmax <= INT32_MAX,
                    "choose_qparams: quant_min/quant_max [", qmin, ", ", qmax,
                    "] must include 0 and be an int32 range");
  TORCH_CHECK_VALUE(std::isfinite(eps) && eps > 0, "choose_qparams: eps must be finite and positive, got ",
                    py_repr(eps));
  TORCH_CHECK_VALUE(scale_out.numel() == 1 && at::isFloatingType(scale_out.scalar_type()),
                    "choose_qparams: scale_out must be one floating element, got ", dtype_name(scale_out.scalar_type()),
                    " of shape ", shape_of(scale_out));
  TORCH_CHECK_VALUE(zero_point_out.numel() == 1 && (at::isIntegralType(zero_point_out.scalar_type(), false) ||
                                                    at::isFloatingType(zero_point_out.scalar_type())),
                    "choose_qparams: zero_point_out must be one real element, got ",
                    dtype_name(zero_point_out.scalar_type()), " of shape ", shape_of(zero_point_out));
  TORCH_CHECK_VALUE(x.numel() > 0, "choose_qparams: the input is empty");
  float scale = 0, min_neg = 0;
  with_float_input(x.scalar_type(), "choose_qparams", [&](auto xt) {
    using X = decltype(xt);
    const at::Tensor xc = x.contiguous();
    const auto [lo, hi] = min_max(xc.const_data_ptr<X>(), xc.numel());
    auto in_x = [](float v) { return static_cast<float>(c10::convert<X>(v)); };
    min_neg = nan_min(lo, 0.0f);
    const float max_pos = nan_max(hi, 0.0f);
    const float span = in_x(max_pos - min_neg);
    scale = nan_max(in_x(span / static_cast<float>(static_cast<double>(qmax - qmin))), static_cast<float>(eps));
  });
  const int64_t rounded = to_i32(round_even(min_neg / scale));
  int64_t zero_point = static_cast<int32_t>(static_cast<uint32_t>(qmin - rounded));  // int32 wrap-around
  zero_point = std::min(std::max(zero_point, qmin), qmax);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, scale_out.scalar_type(), "choose_qparams", [&] {
    *scale_out.mutable_data_ptr<scalar_t>() = c10::convert<scalar_t>(static_cast<double>(scale));
  });
  AT_DISPATCH_ALL_TYPES_AND2(at::kHalf, at::kBFloat16, zero_point_out.scalar_type(), "choose_qparams", [&] {
    *zero_point_out.mutable_data_ptr<scalar_t>() = c10::convert<scalar_t>(zero_point);
  });
}

std::tuple<at::Tensor&, at::Tensor&> choose_qparams_tensor_out(const at::Tensor& x, int64_t qmin, int64_t qmax,
                                                              double eps, at::Tensor& scale_out,
                                                              at::Tensor& zero_point_out) {
  choose_qparams(x, qmin, qmax, eps, scale_out, zero_point_out);
  return {scale_out, zero_point_out};
}

}  // namespace
}  // namespace etlab_native

TORCH_LIBRARY_IMPL(etlab_native, CPU, m) {
  m.impl("choose_qparams.tensor_out", &etlab_native::choose_qparams_tensor_out);
}
