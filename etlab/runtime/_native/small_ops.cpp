// Small-tensor kernels the core picks by operator name (small.h: small_kernel). Edge decomposes a resize
// into index.Tensor gathers weighted by broadcast multiplies, and attention into softmax plus a fully-masked-row
// fix-up (eq, logical_not, any, full_like, where): on tensors of a few hundred elements ATen's advanced-indexing
// and TensorIterator set-up cost 1-5 us a call, several times the work. Each kernel checks every argument
// and returns false (nothing written) for what it does not cover, so ATen then makes the call (and raises its
// own error for a bad one: an index out of range, a shape that does not broadcast). All but softmax give
// ATen's bits: copies, comparisons, and one IEEE operation per element.
#include "small.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

namespace etlab_native {

namespace {

using Args = std::vector<c10::IValue>;

constexpr int kMaxDims = 8;
constexpr int64_t kSmallElementwise = 4096;  // as the core's own elementwise kernels (core.cpp)

// Calls each kernel computed (small_kernel_calls: tests check that a model's calls do take these paths).
enum Kernel { kAdd, kSub, kMul, kIndex, kEq, kNot, kAny, kWhere, kFullLike, kSoftmax, kKernels };
constexpr const char* kNames[kKernels] = {"add.out", "sub.out", "mul.out", "index.Tensor_out", "eq.Scalar_out",
                                          "logical_not.out", "any.out", "where.self_out", "full_like.out",
                                          "_softmax.out"};
std::atomic<int64_t> calls[kKernels];

bool done(Kernel k) {
  calls[k].fetch_add(1, std::memory_order_relaxed);
  return true;
}

bool dense(const at::Tensor& t, at::ScalarType st) { return t.scalar_type() == st && plain_cpu(t); }

// A contiguous output of dtype `st` with at most `limit` elements.
bool small_out(const at::Tensor& out, at::ScalarType st, int64_t limit) {
  return dense(out, st) && out.is_contiguous() && out.numel() <= limit && out.dim() <= kMaxDims;
}

// An input read while `out` is written: lying apart from it, or being it (same data, sizes and contiguous
// layout: each element is read before the same element is written).
bool readable_into(const at::Tensor& t, const at::Tensor& out) {
  if (t.const_data_ptr() == out.const_data_ptr() && t.sizes().equals(out.sizes()) && t.is_contiguous() &&
      t.element_size() == out.element_size())
    return true;
  return tensors_apart(t, out);
}

bool is_one(const c10::IValue& v) {
  if (!v.isScalar()) return false;
  const at::Scalar s = v.toScalar();
  return s.isIntegral(false) ? s.toLong() == 1 : s.isFloatingPoint() && s.toDouble() == 1.0;
}

// A real number as ATen casts a wrapped scalar to a float tensor's type (static_cast, no range check).
bool float_of(const c10::IValue& v, float& out) {
  if (!v.isScalar()) return false;
  const at::Scalar s = v.toScalar();
  if (s.isSymbolic()) return false;
  if (s.isFloatingPoint()) {
    out = static_cast<float>(s.toDouble());
  } else if (s.isIntegral(false)) {
    out = static_cast<float>(s.toLong());
  } else {
    return false;
  }
  return true;
}

// Inputs broadcast to a contiguous output: per input, the element stride along each output dimension
// (0 where it broadcasts).
struct Broadcast {
  int nd = 0;
  int inputs = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[3][kMaxDims] = {};
};

bool make_broadcast(const at::Tensor& out, std::initializer_list<const at::Tensor*> ins, Broadcast& b) {
  b.nd = static_cast<int>(out.dim());
  if (b.nd > kMaxDims || ins.size() > 3) return false;
  for (int d = 0; d < b.nd; ++d) b.sizes[d] = out.size(d);
  int k = 0;
  for (const at::Tensor* t : ins) {
    const int64_t lead = b.nd - t->dim();
    if (lead < 0) return false;
    for (int d = 0; d < b.nd; ++d) {
      int64_t stride = 0;
      if (d >= lead) {
        const int64_t s = t->size(d - lead);
        if (s != b.sizes[d] && s != 1) return false;
        if (s != 1) stride = t->stride(d - lead);
      }
      b.strides[k][d] = stride;
    }
    ++k;
  }
  b.inputs = k;
  return true;
}

// Calls row(o, offsets, n, inner strides) for each run of n outputs along the last dimension, starting at
// output element o and input elements offsets[k].
template <class Row>
void for_rows(const Broadcast& b, Row row) {
  int64_t off[3] = {0, 0, 0};
  if (b.nd == 0) {
    row(int64_t{0}, off, int64_t{1}, off);
    return;
  }
  const int last = b.nd - 1;
  const int64_t inner = b.sizes[last];
  int64_t total = 1;
  for (int d = 0; d < b.nd; ++d) total *= b.sizes[d];
  if (total == 0) return;
  const int64_t inner_strides[3] = {b.strides[0][last], b.strides[1][last], b.strides[2][last]};
  int64_t index[kMaxDims] = {};
  for (int64_t o = 0; o < total; o += inner) {
    row(o, off, inner, inner_strides);
    for (int d = last - 1; d >= 0; --d) {
      for (int k = 0; k < b.inputs; ++k) off[k] += b.strides[k][d];
      if (++index[d] < b.sizes[d]) break;
      for (int k = 0; k < b.inputs; ++k) off[k] -= b.sizes[d] * b.strides[k][d];
      index[d] = 0;
    }
  }
}

// -- add / sub / mul with broadcasts (the same-shape case is the core's: core.cpp run_elementwise) ---------

// r[i] = op(a[i * sa], c[i * sc]) in blocks of constant length the compiler vectorizes (each result kept until
// the block's reads are done: r may be a or c); sa, sc are 0 or 1, known where it is called.
template <class Op>
inline void row(const float* a, int64_t sa, const float* c, int64_t sc, float* r, int64_t n, Op op) {
  constexpr int64_t kBlock = 8;
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    float t[kBlock];
    for (int64_t k = 0; k < kBlock; ++k) t[k] = op(a[(i + k) * sa], c[(i + k) * sc]);
    for (int64_t k = 0; k < kBlock; ++k) r[i + k] = t[k];
  }
  for (; i < n; ++i) r[i] = op(a[i * sa], c[i * sc]);
}

template <class Op>
bool binary_floats(Kernel k, const at::Tensor& x, const at::Tensor& y, const at::Tensor& out, Op op) {
  if (!small_out(out, at::kFloat, kSmallElementwise) || !dense(x, at::kFloat) || !dense(y, at::kFloat)) return false;
  if (!readable_into(x, out) || !readable_into(y, out)) return false;
  Broadcast b;
  if (!make_broadcast(out, {&x, &y}, b)) return false;
  const float* p = x.const_data_ptr<float>();
  const float* q = y.const_data_ptr<float>();
  float* w = out.mutable_data_ptr<float>();
  for_rows(b, [&](int64_t o, const int64_t* off, int64_t n, const int64_t* st) {
    const float* a = p + off[0];
    const float* c = q + off[1];
    float* r = w + o;
    if (st[0] == 1 && st[1] == 1) {
      row(a, 1, c, 1, r, n, op);
    } else if (st[0] == 1 && st[1] == 0) {
      row(a, 1, c, 0, r, n, op);
    } else if (st[0] == 0 && st[1] == 1) {
      row(a, 0, c, 1, r, n, op);
    } else {
      for (int64_t i = 0; i < n; ++i) r[i] = op(a[i * st[0]], c[i * st[1]]);
    }
  });
  out.unsafeGetTensorImpl()->bump_version();
  return done(k);
}

// add.out / sub.out(self, other, alpha, out) with alpha 1: a + b (a - b), whether ATen fuses alpha * b or not.
bool add_out(const Args& a) {
  return a.size() == 4 && is_one(a[2]) &&
         binary_floats(kAdd, a[0].toTensor(), a[1].toTensor(), a[3].toTensor(), [](float x, float y) { return x + y; });
}
bool sub_out(const Args& a) {
  return a.size() == 4 && is_one(a[2]) &&
         binary_floats(kSub, a[0].toTensor(), a[1].toTensor(), a[3].toTensor(), [](float x, float y) { return x - y; });
}
bool mul_out(const Args& a) {
  return a.size() == 3 &&
         binary_floats(kMul, a[0].toTensor(), a[1].toTensor(), a[2].toTensor(), [](float x, float y) { return x * y; });
}

// -- index.Tensor_out(self, indices, out): a gather with int64 index tensors --------------------------------

template <class T>
void gather(const char* src, char* dst, const int64_t* offsets, int64_t n_index, int64_t before,
            const int64_t* before_sizes, const int64_t* before_strides, int n_before, int64_t after,
            int64_t after_stride) {
  const T* s = reinterpret_cast<const T*>(src);
  T* o = reinterpret_cast<T*>(dst);
  int64_t index[kMaxDims] = {};
  int64_t base = 0;
  for (int64_t r = 0; r < before; ++r) {
    if (after == 1) {
      for (int64_t b = 0; b < n_index; ++b) o[b] = s[base + offsets[b]];
      o += n_index;
    } else {
      for (int64_t b = 0; b < n_index; ++b) {
        const T* from = s + base + offsets[b];
        for (int64_t i = 0; i < after; ++i) o[i] = from[i * after_stride];
        o += after;
      }
    }
    for (int d = n_before - 1; d >= 0; --d) {
      base += before_strides[d];
      if (++index[d] < before_sizes[d]) break;
      base -= before_sizes[d] * before_strides[d];
      index[d] = 0;
    }
  }
}

bool index_out(const Args& a) {
  if (a.size() != 3 || !a[0].isTensor() || !a[1].isList() || !a[2].isTensor()) return false;
  const at::Tensor& self = a[0].toTensor();
  const at::Tensor& out = a[2].toTensor();
  const size_t es = self.element_size();
  if (!plain_cpu(self) || !plain_cpu(out) || out.scalar_type() != self.scalar_type() || !out.is_contiguous() ||
      out.numel() > kSmallCopyElements || out.numel() == 0 || !(es == 1 || es == 2 || es == 4 || es == 8))
    return false;
  const auto list = a[1].toListRef();
  const int64_t nd = self.dim();
  if (list.empty() || static_cast<int64_t>(list.size()) > nd || nd > kMaxDims) return false;
  // the index tensors: one run of adjacent dimensions (the result's index dimensions then stand where they are)
  const at::Tensor* idx[kMaxDims];
  int first = -1, count = 0;
  for (size_t k = 0; k < list.size(); ++k) {
    if (list[k].isNone()) continue;
    if (!list[k].isTensor()) return false;
    const at::Tensor& t = list[k].toTensor();
    if (!dense(t, at::kLong) || t.dim() > kMaxDims || !tensors_apart(t, out)) return false;
    if (first < 0) first = static_cast<int>(k);
    if (static_cast<int>(k) != first + count) return false;
    idx[count++] = &t;
  }
  if (count == 0 || !tensors_apart(self, out)) return false;
  // the shape the index tensors broadcast to
  int bd = 0;
  for (int j = 0; j < count; ++j) bd = std::max(bd, static_cast<int>(idx[j]->dim()));
  int64_t bsizes[kMaxDims];
  std::fill(bsizes, bsizes + kMaxDims, 1);
  for (int j = 0; j < count; ++j) {
    const int lead = bd - static_cast<int>(idx[j]->dim());
    for (int d = lead; d < bd; ++d) {
      const int64_t s = idx[j]->size(d - lead);
      if (bsizes[d] == 1) {
        bsizes[d] = s;
      } else if (s != 1 && s != bsizes[d]) {
        return false;
      }
    }
  }
  const int last = first + count;  // one past the last indexed dimension
  const int n_after = static_cast<int>(nd) - last;
  if (out.dim() != first + bd + n_after) return false;
  for (int d = 0; d < first; ++d)
    if (out.size(d) != self.size(d)) return false;
  int64_t n_index = 1;
  for (int d = 0; d < bd; ++d) {
    if (out.size(first + d) != bsizes[d]) return false;
    n_index *= bsizes[d];
  }
  for (int d = 0; d < n_after; ++d)
    if (out.size(first + bd + d) != self.size(last + d)) return false;
  // the dimensions after the indexed ones: one strided run
  int64_t after = 1, after_stride = 1;
  for (int d = static_cast<int>(nd) - 1; d >= last; --d) {
    if (self.size(d) == 1) continue;
    if (after == 1) {
      after_stride = self.stride(d);
    } else if (self.stride(d) != after * after_stride) {
      return false;
    }
    after *= self.size(d);
  }
  // each index position's element offset in self (negative indices count from the end; any out of range
  // leaves the call to ATen, which names it): first each index tensor's own elements' offsets, then their sums
  // over the broadcast shape, a run along its last dimension at a time
  thread_local std::vector<int64_t> offsets, parts;
  int64_t n_parts = 0;
  for (int j = 0; j < count; ++j) n_parts += idx[j]->numel();
  parts.resize(static_cast<size_t>(n_parts));
  int64_t* part[kMaxDims];
  int64_t st[kMaxDims][kMaxDims];  // per index tensor, its element stride along each broadcast dimension
  int64_t* next = parts.data();
  for (int j = 0; j < count; ++j) {
    const at::Tensor& t = *idx[j];
    if (!t.is_contiguous()) return false;
    const int64_t size = self.size(first + j), stride = self.stride(first + j), n = t.numel();
    const int64_t* v = t.const_data_ptr<int64_t>();
    part[j] = next;
    for (int64_t k = 0; k < n; ++k) {
      int64_t i = v[k];
      if (i < 0) i += size;
      if (i < 0 || i >= size) return false;
      next[k] = i * stride;
    }
    next += n;
    const int lead = bd - static_cast<int>(t.dim());
    int64_t contiguous = 1;
    for (int d = bd - 1; d >= 0; --d) {
      const int64_t s = d < lead ? 1 : t.size(d - lead);
      st[j][d] = s == 1 ? 0 : contiguous;
      contiguous *= s;
    }
  }
  offsets.resize(static_cast<size_t>(n_index));
  {
    const int64_t inner = bd > 0 ? bsizes[bd - 1] : 1;
    int64_t index[kMaxDims] = {}, pos[kMaxDims] = {};
    for (int64_t b = 0; b < n_index; b += inner) {
      int64_t* o = offsets.data() + b;
      for (int j = 0; j < count; ++j) {
        const int64_t* p = part[j] + pos[j];
        const int64_t s = bd > 0 ? st[j][bd - 1] : 0;
        if (j == 0) {
          for (int64_t i = 0; i < inner; ++i) o[i] = p[i * s];
        } else {
          for (int64_t i = 0; i < inner; ++i) o[i] += p[i * s];
        }
      }
      for (int d = bd - 2; d >= 0; --d) {
        for (int j = 0; j < count; ++j) pos[j] += st[j][d];
        if (++index[d] < bsizes[d]) break;
        for (int j = 0; j < count; ++j) pos[j] -= bsizes[d] * st[j][d];
        index[d] = 0;
      }
    }
  }
  int64_t before = 1, before_sizes[kMaxDims], before_strides[kMaxDims];
  for (int d = 0; d < first; ++d) {
    before_sizes[d] = self.size(d);
    before_strides[d] = self.stride(d);
    before *= self.size(d);
  }
  const char* src = static_cast<const char*>(self.const_data_ptr());
  char* dst = static_cast<char*>(out.mutable_data_ptr());
  const int64_t* offs = offsets.data();
  switch (es) {
    case 1: gather<uint8_t>(src, dst, offs, n_index, before, before_sizes, before_strides, first, after, after_stride); break;
    case 2: gather<uint16_t>(src, dst, offs, n_index, before, before_sizes, before_strides, first, after, after_stride); break;
    case 4: gather<uint32_t>(src, dst, offs, n_index, before, before_sizes, before_strides, first, after, after_stride); break;
    default: gather<uint64_t>(src, dst, offs, n_index, before, before_sizes, before_strides, first, after, after_stride);
  }
  out.unsafeGetTensorImpl()->bump_version();
  return done(kIndex);
}

// -- masks: eq.Scalar, logical_not, any over the last dimension, where, full_like ----------------------------

// A contiguous input of `out`'s sizes.
bool same_shape_input(const at::Tensor& t, const at::Tensor& out) {
  return plain_cpu(t) && t.is_contiguous() && t.sizes().equals(out.sizes()) && readable_into(t, out);
}

// eq.Scalar_out(self, other, out): float self against the number cast to float (ATen compares in the tensor's
// dtype), bool out.
bool eq_scalar_out(const Args& a) {
  if (a.size() != 3) return false;
  const at::Tensor& x = a[0].toTensor();
  const at::Tensor& out = a[2].toTensor();
  float s = 0.0f;
  if (!small_out(out, at::kBool, kSmallElementwise) || !dense(x, at::kFloat) || !same_shape_input(x, out) ||
      !float_of(a[1], s))
    return false;
  const float* p = x.const_data_ptr<float>();
  bool* o = out.mutable_data_ptr<bool>();
  const int64_t n = out.numel();
  for (int64_t i = 0; i < n; ++i) o[i] = p[i] == s;
  out.unsafeGetTensorImpl()->bump_version();
  return done(kEq);
}

// logical_not.out(self, out): bool or float self, bool out.
bool logical_not_out(const Args& a) {
  if (a.size() != 2) return false;
  const at::Tensor& x = a[0].toTensor();
  const at::Tensor& out = a[1].toTensor();
  if (!small_out(out, at::kBool, kSmallElementwise) || !same_shape_input(x, out)) return false;
  const int64_t n = out.numel();
  bool* o = out.mutable_data_ptr<bool>();
  if (x.scalar_type() == at::kBool) {
    const bool* p = x.const_data_ptr<bool>();
    for (int64_t i = 0; i < n; ++i) o[i] = !p[i];
  } else if (x.scalar_type() == at::kFloat) {
    const float* p = x.const_data_ptr<float>();
    for (int64_t i = 0; i < n; ++i) o[i] = !(p[i] != 0.0f);  // NaN is true, so its negation false
  } else {
    return false;
  }
  out.unsafeGetTensorImpl()->bump_version();
  return done(kNot);
}

// any.out(self, dim, keepdim, out) of a bool tensor over its last dimension.
bool any_out(const Args& a) {
  if (a.size() != 4 || !a[1].isInt() || !a[2].isBool()) return false;
  const at::Tensor& x = a[0].toTensor();
  const at::Tensor& out = a[3].toTensor();
  const int64_t nd = x.dim();
  int64_t dim = a[1].toInt();
  if (dim < 0) dim += nd;
  if (nd == 0 || dim != nd - 1 || !dense(x, at::kBool) || !x.is_contiguous() || x.numel() > kSmallElementwise ||
      !small_out(out, at::kBool, kSmallElementwise) || !tensors_apart(x, out))
    return false;
  const bool keepdim = a[2].toBool();
  if (out.dim() != (keepdim ? nd : nd - 1)) return false;
  for (int64_t d = 0; d < nd - 1; ++d)
    if (out.size(d) != x.size(d)) return false;
  if (keepdim && out.size(nd - 1) != 1) return false;
  const int64_t n = x.size(nd - 1), rows = out.numel();
  if (n == 0) return false;
  const bool* p = x.const_data_ptr<bool>();
  bool* o = out.mutable_data_ptr<bool>();
  for (int64_t r = 0; r < rows; ++r) {
    bool found = false;
    for (int64_t i = 0; i < n; ++i) found = found || p[r * n + i];
    o[r] = found;
  }
  out.unsafeGetTensorImpl()->bump_version();
  return done(kAny);
}

// where.self_out(condition, self, other, out): bool condition, float self and other, all broadcast to out.
bool where_out(const Args& a) {
  if (a.size() != 4) return false;
  const at::Tensor& c = a[0].toTensor();
  const at::Tensor& x = a[1].toTensor();
  const at::Tensor& y = a[2].toTensor();
  const at::Tensor& out = a[3].toTensor();
  if (!small_out(out, at::kFloat, kSmallElementwise) || !dense(c, at::kBool) || !dense(x, at::kFloat) ||
      !dense(y, at::kFloat) || !tensors_apart(c, out) || !readable_into(x, out) || !readable_into(y, out))
    return false;
  Broadcast b;
  if (!make_broadcast(out, {&c, &x, &y}, b)) return false;
  const bool* pc = c.const_data_ptr<bool>();
  const float* px = x.const_data_ptr<float>();
  const float* py = y.const_data_ptr<float>();
  float* w = out.mutable_data_ptr<float>();
  for_rows(b, [&](int64_t o, const int64_t* off, int64_t n, const int64_t* st) {
    const bool* cc = pc + off[0];
    const float* xx = px + off[1];
    const float* yy = py + off[2];
    float* r = w + o;
    for (int64_t i = 0; i < n; ++i) r[i] = cc[i * st[0]] ? xx[i * st[1]] : yy[i * st[2]];
  });
  out.unsafeGetTensorImpl()->bump_version();
  return done(kWhere);
}

// full_like.out(self, fill_value, memory_format, out): out (float, self's dtype and sizes) filled with the number.
bool full_like_out(const Args& a) {
  if (a.size() != 3 && a.size() != 4) return false;
  const at::Tensor& x = a[0].toTensor();
  const at::Tensor& out = a.back().toTensor();
  if (a.size() == 4 && !a[2].isNone()) {
    if (!a[2].isInt()) return false;
    const auto format = static_cast<c10::MemoryFormat>(a[2].toInt());
    if (format != c10::MemoryFormat::Preserve && format != c10::MemoryFormat::Contiguous) return false;
  }
  float s = 0.0f;
  if (!small_out(out, at::kFloat, kSmallElementwise) || !dense(x, at::kFloat) || !x.is_contiguous() ||
      !x.sizes().equals(out.sizes()) || !float_of(a[1], s))
    return false;
  std::fill_n(out.mutable_data_ptr<float>(), out.numel(), s);
  out.unsafeGetTensorImpl()->bump_version();
  return done(kFullLike);
}

// -- _softmax.out(self, dim, half_to_float, out) over the last dimension of a float tensor -------------------

// exp(x - max) / sum per row, the exponentials with ATen's vector exp (small.cpp exp_floats): within a few
// ulps of ATen's kernel, which sums its row in vector lanes.
bool softmax_out(const Args& a) {
  if (a.size() != 4 || !a[1].isInt() || !a[2].isBool() || a[2].toBool()) return false;
  const at::Tensor& x = a[0].toTensor();
  const at::Tensor& out = a[3].toTensor();
  const int64_t nd = x.dim();
  int64_t dim = a[1].toInt();
  if (dim < 0) dim += nd;
  if (nd == 0 || dim != nd - 1 || !small_out(out, at::kFloat, 4 * kSmallElementwise) || !dense(x, at::kFloat) ||
      !same_shape_input(x, out))
    return false;
  const int64_t n = x.size(nd - 1), total = out.numel();
  if (n == 0 || total == 0) return false;
  const float* p = x.const_data_ptr<float>();
  float* o = out.mutable_data_ptr<float>();
  for (int64_t r = 0; r < total; r += n) {
    float m = p[r];
    for (int64_t i = 1; i < n; ++i) {
      const float v = p[r + i];
      if (v > m || v != v) m = v;  // a NaN stays (ATen's vector maximum propagates it)
      if (m != m) break;
    }
    for (int64_t i = 0; i < n; ++i) o[r + i] = p[r + i] - m;
  }
  exp_floats(o, o, total);
  for (int64_t r = 0; r < total; r += n) {
    float sum = 0.0f;
    for (int64_t i = 0; i < n; ++i) sum += o[r + i];
    const float inv = 1.0f / sum;
    for (int64_t i = 0; i < n; ++i) o[r + i] *= inv;
  }
  out.unsafeGetTensorImpl()->bump_version();
  return done(kSoftmax);
}

}  // namespace

std::map<std::string, int64_t> small_kernel_calls() {
  std::map<std::string, int64_t> out;
  for (int k = 0; k < kKernels; ++k) out[kNames[k]] = calls[k].load(std::memory_order_relaxed);
  return out;
}

SmallFn small_kernel(const std::string& name, const std::string& overload, bool inexact) {
  if (overload == "out") {
    if (name == "aten::add") return add_out;
    if (name == "aten::sub") return sub_out;
    if (name == "aten::mul") return mul_out;
    if (name == "aten::logical_not") return logical_not_out;
    if (name == "aten::any") return any_out;
    if (name == "aten::full_like") return full_like_out;
    if (name == "aten::_softmax") return inexact ? softmax_out : nullptr;
    return nullptr;
  }
  if (name == "aten::index" && overload == "Tensor_out") return index_out;
  if (name == "aten::eq" && overload == "Scalar_out") return eq_scalar_out;
  if (name == "aten::where" && overload == "self_out") return where_out;
  return nullptr;
}

}  // namespace etlab_native
