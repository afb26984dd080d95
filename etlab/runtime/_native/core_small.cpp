// The native core's own kernels for small tensors, chosen per step (core.h: `small_kind`, `run_small`): the
// elementwise add/sub/mul/div, sigmoid/tanh and number products it computes itself, and which small.h kernel
// (view copies, one-row products) a step's call goes to. ATen's dispatch, TensorIterator set-up and output
// checks cost more than the arithmetic on a few hundred floats.
#include "core.h"

namespace etlab_native {

// The operators `run_small` may compute by name: the out-variants of add/sub (alpha), mul/div, addmm and mm
// (copies are set by `set_view_copy`).
Small small_kind(const std::string& name, const std::string& overload, Fast fast) {
  if (fast == Fast::TS) return name == "aten::mul" && overload == "Scalar_out" ? Small::MulScalar : Small::None;
  if (overload != "out") return Small::None;
  if (fast == Fast::TTS) return name == "aten::add" ? Small::Add : name == "aten::sub" ? Small::Sub : Small::None;
  if (fast == Fast::TT) {
    if (name == "aten::mm") return Small::Mm;
    return name == "aten::mul" ? Small::Mul : name == "aten::div" ? Small::Div : Small::None;
  }
  if (fast == Fast::TTTSS && name == "aten::addmm") return Small::Addmm;
  if (fast == Fast::T) return name == "aten::sigmoid" ? Small::Sigmoid : name == "aten::tanh" ? Small::Tanh : Small::None;
  return Small::None;
}

namespace {

// At most this many elements: above it ATen's vectorized (and, with threads, parallel) loop wins.
constexpr int64_t kSmallElements = 4096;

// The same sizes once unit dimensions are dropped: a broadcast that only adds unit dimensions ((1, 1, 32)
// with (1, 32)), so the two contiguous tensors hold the same elements in the same order.
bool same_but_units(c10::IntArrayRef a, c10::IntArrayRef b) {
  size_t i = 0, j = 0;
  while (true) {
    while (i < a.size() && a[i] == 1) ++i;
    while (j < b.size() && b[j] == 1) ++j;
    if (i == a.size() || j == b.size()) return i == a.size() && j == b.size();
    if (a[i++] != b[j++]) return false;
  }
}

// A dense contiguous float32 CPU tensor of `out`'s elements (its shape, up to unit dimensions): no lazy
// negation, no subclass or functionalization (whose keys would take the call elsewhere).
bool small_operand(const at::Tensor& t, const at::Tensor& out) {
  static const c10::DispatchKeySet elsewhere({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot,
                                             c10::DispatchKey::Functionalize, c10::DispatchKey::Negative,
                                             c10::DispatchKey::Conjugate, c10::DispatchKey::ZeroTensor});
  return t.layout() == at::kStrided && t.device().is_cpu() && t.scalar_type() == at::kFloat &&
         (t.sizes().equals(out.sizes()) || same_but_units(t.sizes(), out.sizes())) && t.is_contiguous() &&
         !t.key_set().has_any(elsewhere) && t.has_storage();
}

// `t` is `out` itself or lies apart from it (a partial overlap is left to ATen, which refuses it).
bool same_or_apart(const at::Tensor& t, const at::Tensor& out, size_t bytes) {
  const auto a = reinterpret_cast<uintptr_t>(t.const_data_ptr());
  const auto o = reinterpret_cast<uintptr_t>(out.const_data_ptr());
  return a == o || a + bytes <= o || o + bytes <= a;
}

bool is_one(const at::Scalar& s) {
  return s.isIntegral(false) ? s.toLong() == 1 : s.isFloatingPoint() && s.toDouble() == 1.0;
}

// Computes an add/sub (alpha 1)/mul/div out-variant on small same-shape float tensors as ATen's CPU
// kernel would, bit for bit (one IEEE operation per element); false (nothing done) for anything else.
bool run_elementwise(const Instr& in) {
  const auto& a = in.args;
  const at::Tensor& out = a[in.fast == Fast::TTS ? 3 : 2].toTensor();
  const int64_t n = out.numel();
  if (n > kSmallElements || !small_operand(out, out)) return false;
  const at::Tensor& x = a[0].toTensor();
  const at::Tensor& y = a[1].toTensor();
  if (!small_operand(x, out) || !small_operand(y, out)) return false;
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  if (!same_or_apart(x, out, bytes) || !same_or_apart(y, out, bytes)) return false;
  // alpha must be exactly 1 (ATen's vectorized x + alpha * y may fuse the multiply-add)
  if (in.fast == Fast::TTS && !is_one(in.s0)) return false;
  const float* p = x.const_data_ptr<float>();
  const float* q = y.const_data_ptr<float>();
  float* o = out.mutable_data_ptr<float>();
  switch (in.small) {
    case Small::Add:
      add_floats(p, q, o, n);
      break;
    case Small::Sub:
      sub_floats(p, q, o, n);
      break;
    case Small::Mul:
      mul_floats(p, q, o, n);
      break;
    case Small::Div:
      div_floats(p, q, o, n);
      break;
    default:
      return false;
  }
  out.unsafeGetTensorImpl()->bump_version();  // as ATen's out-variant does
  return true;
}

// sigmoid/tanh out-variants on small float tensors (x may be out), as ATen's CPU kernel computes them.
bool run_unary(const Instr& in) {
  const at::Tensor& x = in.args[0].toTensor();
  const at::Tensor& out = in.args[1].toTensor();
  const int64_t n = out.numel();
  if (n > kSmallElements || !small_operand(out, out) || !small_operand(x, out)) return false;
  if (!same_or_apart(x, out, static_cast<size_t>(n) * sizeof(float))) return false;
  const float* p = x.const_data_ptr<float>();
  float* o = out.mutable_data_ptr<float>();
  if (!(in.small == Small::Sigmoid ? sigmoid_floats(p, o, n) : tanh_floats(p, o, n))) return false;
  out.unsafeGetTensorImpl()->bump_version();
  return true;
}

// mul.Scalar_out(self, other, out) on a small float tensor times a real number (x may be out): ATen casts the
// number to float and multiplies each element once, as here.
bool run_mul_scalar(const Instr& in) {
  const at::Tensor& x = in.args[0].toTensor();
  const at::Tensor& out = in.args[2].toTensor();
  const int64_t n = out.numel();
  if (n > kSmallElements || !small_operand(out, out) || !small_operand(x, out)) return false;
  if (!same_or_apart(x, out, static_cast<size_t>(n) * sizeof(float))) return false;
  const at::Scalar& s = in.s0;
  if (s.isSymbolic() || !(s.isFloatingPoint() || s.isIntegral(false))) return false;
  // the cast ATen's loop makes of the wrapped number (static_cast: no overflow check)
  const float factor = s.isFloatingPoint() ? static_cast<float>(s.toDouble()) : static_cast<float>(s.toLong());
  mul_scalar_floats(x.const_data_ptr<float>(), factor, out.mutable_data_ptr<float>(), n);
  out.unsafeGetTensorImpl()->bump_version();
  return true;
}

}  // namespace

// A small kernel of small.h (or the elementwise ones above) for `in`, when it covers the call.
bool run_small(const Instr& in) {
  const auto& a = in.args;
  switch (in.small) {
    case Small::Copy:
      return run_view_copy(*in.copy);
    case Small::Addmm:  // addmm.out(self, mat1, mat2, beta, alpha, out)
      return is_one(in.s0) && is_one(in.s1) && run_gemv(&a[0].toTensor(), a[1].toTensor(), a[2].toTensor(),
                                                        a[5].toTensor());
    case Small::Mm:  // mm.out(self, mat2, out)
      return run_gemv(nullptr, a[0].toTensor(), a[1].toTensor(), a[2].toTensor());
    case Small::Sigmoid:
    case Small::Tanh:
      return run_unary(in);
    case Small::MulScalar:
      return run_mul_scalar(in);
    case Small::None:
    case Small::Fn:
      return false;
    default:
      return run_elementwise(in);
  }
}

}  // namespace etlab_native
