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
#include "qconv_internal.h"

namespace etlab_native {
// hidden, as pybind11 is: these names are internal to the module
namespace int8 __attribute__((visibility("hidden"))) {

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

}  // namespace int8

void bind_int8_kernels(pybind11::module_& m) {
  using namespace int8;
  using py::arg;
  m.def("int8_isa", [](int64_t requested) { return choose_isa(requested); }, arg("requested") = -1,
        "The int8 kernels' instruction set for an object made now: 0 scalar, 1 AVX2, 2 AVX-512 VNNI");
  bind_int8_eltwise(m);
  bind_int8_gemm(m);
  bind_int8_depthwise(m);
  bind_xnn_plan(m);
}

}  // namespace etlab_native
