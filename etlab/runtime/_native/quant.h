// What the native quantization kernels (quant.cpp, quant_choose.cpp) share: messages worded as the
// Python kernels', the scalar arithmetic every loop ends in (torch's casts and roundings spelled out),
// and the dtypes each kernel takes.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/TypeCast.h>

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <type_traits>

namespace etlab_native {
namespace quant {

// -- messages, worded as the Python kernels' --------------------------------------------------------

// Python's repr of a float ("nan", "0.0", "1e-05"), so both cores report a bad scale alike.
inline std::string py_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);  // shortest: [-]d.ddde±XX
  const std::string sci(buf, res.ptr);
  const size_t e = sci.find('e');
  const int exp = std::atoi(sci.c_str() + e + 1);
  const bool neg = sci[0] == '-';
  std::string digits;
  for (size_t i = neg ? 1 : 0; i < e; ++i)
    if (sci[i] != '.') digits += sci[i];
  std::string out = neg ? "-" : "";
  if (exp < -4 || exp >= 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char tail[16];
    std::snprintf(tail, sizeof(tail), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    return out + tail;
  }
  if (exp < 0) return out + "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
  const size_t whole = static_cast<size_t>(exp) + 1;
  if (digits.size() <= whole) return out + digits + std::string(whole - digits.size(), '0') + ".0";
  return out + digits.substr(0, whole) + "." + digits.substr(whole);
}

inline std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "torch.float32";
    case at::kDouble: return "torch.float64";
    case at::kHalf: return "torch.float16";
    case at::kBFloat16: return "torch.bfloat16";
    case at::kByte: return "torch.uint8";
    case at::kChar: return "torch.int8";
    case at::kShort: return "torch.int16";
    case at::kInt: return "torch.int32";
    case at::kLong: return "torch.int64";
    case at::kBool: return "torch.bool";
    default: return std::string("torch.") + c10::toString(t);
  }
}

inline std::string shape_of(const at::Tensor& t) {
  std::string s = "(";
  for (int64_t d = 0; d < t.dim(); ++d) s += (d ? ", " : "") + std::to_string(t.size(d));
  return s + (t.dim() == 1 ? ",)" : ")");
}

// -- arithmetic shared by the scalar and vector loops -------------------------------------------------

// std::nearbyint in the default rounding mode (ties to even, torch.round) without a libm call, so the
// loops vectorize: below 2^(mantissa bits) adding and subtracting that power leaves the nearest integer;
// at or above it (and for inf and nan) the value is its own rounding. The sign is kept (-0.4 -> -0.0).
template <class F>
inline F round_even(F v) {
  constexpr F big = sizeof(F) == 4 ? F(8388608.0) : F(4503599627370496.0);
  const F a = std::fabs(v);
  return a < big ? std::copysign((a + big) - big, v) : v;
}

// What a C++ cast of a float to a 32-bit (or narrower, by truncation) integer gives on this CPU, which
// is what torch's own casts give: on x86 (cvttss2si) nan and out-of-range values become INT32_MIN;
// elsewhere (arm64's fcvtzs) they saturate and nan becomes 0. Spelled out: such a cast is undefined C++.
template <class F>
inline int32_t to_i32(F v) {
  if (v >= F(-2147483648.0) && v < F(2147483648.0)) return static_cast<int32_t>(v);
#if defined(__x86_64__) || defined(__i386__)
  return INT32_MIN;
#else
  return std::isnan(v) ? 0 : (v > 0 ? INT32_MAX : INT32_MIN);
#endif
}

// One value quantized in compute type F (float, or double for float64 per-channel scales).
template <class Q, class F>
inline Q quantize_one(F x, F inv_scale, F zero_point, bool add_zero_point, F lo, F hi) {
  F v = round_even(x * inv_scale);
  if (add_zero_point) v = v + zero_point;
  v = v < lo ? lo : v;  // torch.clamp: nan stays nan
  v = v > hi ? hi : v;
  return static_cast<Q>(to_i32(v));
}

// opmath: the type torch computes a T in (reduced floats in float).
template <class T>
using Opmath = std::conditional_t<std::is_same_v<T, double>, double, float>;

// One value dequantized into T: T(q), minus the zero point (already in T's opmath, rounded as torch
// rounds it), stored as T; times the scale in D (T's opmath, or the promotion of T and a per-channel
// scale's dtype), stored as T.
template <class T, class D, class Q>
inline T dequantize_one(Q q, Opmath<T> zero_point, bool sub_zero_point, D scale) {
  T t = c10::convert<T>(q);
  if (sub_zero_point) t = c10::convert<T>(static_cast<Opmath<T>>(t) - zero_point);
  return c10::convert<T>(static_cast<D>(t) * scale);
}

// -- dtypes -------------------------------------------------------------------------------------------

// Calls f(Q{}) for the quantized dtypes (torch's _DTYPE_TO_QVALUE_BOUNDS keys).
template <class F>
void with_q(at::ScalarType t, F&& f) {
  switch (t) {
    case at::kByte: return f(uint8_t{});
    case at::kChar: return f(int8_t{});
    case at::kShort: return f(int16_t{});
    case at::kInt: return f(int32_t{});
    default: TORCH_CHECK_VALUE(false, "quantized dtype ", dtype_name(t),
                               " is not one of torch.uint8, torch.int8, torch.int16, torch.int32");
  }
}

template <class F>
void with_float_input(at::ScalarType t, const char* what, F&& f) {
  switch (t) {
    case at::kFloat: return f(float{});
    case at::kHalf: return f(c10::Half{});
    case at::kBFloat16: return f(c10::BFloat16{});
    default: TORCH_CHECK_VALUE(false, what, ": input must be float32/float16/bfloat16, got ", dtype_name(t));
  }
}

template <class F>
void with_float_output(at::ScalarType t, const char* what, F&& f) {
  switch (t) {
    case at::kFloat: return f(float{});
    case at::kDouble: return f(double{});
    case at::kHalf: return f(c10::Half{});
    case at::kBFloat16: return f(c10::BFloat16{});
    default: TORCH_CHECK_VALUE(false, what, ": out_dtype must be floating, got ", dtype_name(t));
  }
}

// Per-channel scales the native kernels take (the Python kernels take any floating dtype; _plan.py
// binds other dtypes to them).
template <class F>
void with_scales(at::ScalarType t, const char* what, F&& f) {
  switch (t) {
    case at::kFloat: return f(float{});
    case at::kDouble: return f(double{});
    default: TORCH_CHECK_VALUE(false, what, ": the native kernel takes float32/float64 scales, got ", dtype_name(t));
  }
}

inline void check_range(int64_t qmin, int64_t qmax, at::ScalarType t) {
  with_q(t, [&](auto q) {
    using Q = decltype(q);
    const int64_t lo = std::numeric_limits<Q>::min(), hi = std::numeric_limits<Q>::max();
    TORCH_CHECK_VALUE(lo <= qmin && qmin <= qmax && qmax <= hi, "quant_min/quant_max [", qmin, ", ", qmax,
                      "] is not a range within ", dtype_name(t), "'s [", lo, ", ", hi, "]");
  });
}

inline void check_scale(double scale) {
  TORCH_CHECK_VALUE(std::isfinite(scale) && scale > 0, "scale must be finite and positive, got ", py_repr(scale));
}

}  // namespace quant
}  // namespace etlab_native
