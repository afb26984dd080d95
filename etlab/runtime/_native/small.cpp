// Small-tensor kernels of the native core (see small.h).
#include "small.h"

#include <ATen/Parallel.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

// The loops below are compiled for the widest vector units the CPU has, chosen when the library loads
// (GCC's function multi-versioning); elsewhere once, for the baseline.
#if defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
#define ETLAB_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define ETLAB_CLONES
#endif

namespace etlab_native {

bool plain_cpu(const at::Tensor& t) {
  static const c10::DispatchKeySet elsewhere({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot,
                                             c10::DispatchKey::Functionalize, c10::DispatchKey::Negative,
                                             c10::DispatchKey::Conjugate, c10::DispatchKey::ZeroTensor});
  return t.defined() && t.layout() == at::kStrided && t.device().is_cpu() && !t.key_set().has_any(elsewhere) &&
         t.has_storage();
}

namespace {

// [lo, hi) byte ranges lie apart.
bool apart(uintptr_t lo_a, uintptr_t hi_a, uintptr_t lo_b, uintptr_t hi_b) { return hi_a <= lo_b || hi_b <= lo_a; }

uintptr_t address(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.const_data_ptr()); }

// The byte range a dense tensor's elements span (its strides non-negative).
std::pair<uintptr_t, uintptr_t> span(const at::Tensor& t) {
  int64_t last = 0;
  for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
  const uintptr_t lo = address(t);
  return {lo, lo + static_cast<uintptr_t>((last + 1) * static_cast<int64_t>(t.element_size()))};
}

// Drops unit dimensions and merges neighbours that step through memory as one.
void merge_dims(const at::Tensor& view, std::vector<int64_t>& sizes, std::vector<int64_t>& strides) {
  sizes.clear();
  strides.clear();
  for (int64_t d = 0; d < view.dim(); ++d) {
    if (view.size(d) == 1) continue;
    if (!sizes.empty() && strides.back() == view.stride(d) * view.size(d)) {
      sizes.back() *= view.size(d);
      strides.back() = view.stride(d);
    } else {
      sizes.push_back(view.size(d));
      strides.push_back(view.stride(d));
    }
  }
  if (sizes.empty()) {
    sizes.push_back(1);
    strides.push_back(1);
  }
}

template <class T>
void copy_strided(T* out, const T* src, int64_t n, int64_t stride) {
  for (int64_t i = 0; i < n; ++i) out[i] = src[i * stride];
}

// Copies one part: rows of the innermost dimension, the outer ones stepped like an odometer.
void copy_part(const ViewCopy::Part& p, const char* base, size_t es) {
  char* o = static_cast<char*>(p.out.mutable_data_ptr());
  const char* s = base + p.offset * static_cast<int64_t>(es);
  const int64_t inner = p.sizes.back();
  const int64_t istride = p.strides.back();
  const int64_t rows = p.numel / inner;
  const int nd = static_cast<int>(p.sizes.size());
  int64_t index[16] = {};
  const size_t row_bytes = static_cast<size_t>(inner) * es;
  for (int64_t r = 0; r < rows; ++r) {
    if (istride == 1) {
      std::memcpy(o, s, row_bytes);
    } else if (es == 4) {
      copy_strided(reinterpret_cast<uint32_t*>(o), reinterpret_cast<const uint32_t*>(s), inner, istride);
    } else if (es == 8) {
      copy_strided(reinterpret_cast<uint64_t*>(o), reinterpret_cast<const uint64_t*>(s), inner, istride);
    } else if (es == 2) {
      copy_strided(reinterpret_cast<uint16_t*>(o), reinterpret_cast<const uint16_t*>(s), inner, istride);
    } else {
      for (int64_t i = 0; i < inner; ++i) std::memcpy(o + i * es, s + i * istride * static_cast<int64_t>(es), es);
    }
    o += row_bytes;
    for (int d = nd - 2; d >= 0; --d) {  // the next row's start
      s += p.strides[d] * static_cast<int64_t>(es);
      if (++index[d] < p.sizes[d]) break;
      s -= p.sizes[d] * p.strides[d] * static_cast<int64_t>(es);
      index[d] = 0;
    }
  }
}

}  // namespace

bool tensors_apart(const at::Tensor& a, const at::Tensor& b) {
  for (const at::Tensor* t : {&a, &b})
    for (int64_t d = 0; d < t->dim(); ++d)
      if (t->stride(d) < 0) return false;
  if (a.numel() == 0 || b.numel() == 0) return true;
  const auto x = span(a), y = span(b);
  return apart(x.first, x.second, y.first, y.second);
}

ViewCopy make_view_copy(const at::Tensor& src, const std::vector<at::Tensor>& views,
                        const std::vector<at::Tensor>& outs) {
  if (views.size() != outs.size() || views.empty()) throw std::invalid_argument("view copy: one view per output");
  if (!plain_cpu(src)) throw std::invalid_argument("view copy: the source is not a dense CPU tensor");
  ViewCopy copy;
  copy.src = src;
  copy.src_sizes.assign(src.sizes().begin(), src.sizes().end());
  copy.src_strides.assign(src.strides().begin(), src.strides().end());
  int64_t total = 0;
  for (size_t k = 0; k < views.size(); ++k) {
    const at::Tensor& v = views[k];
    const at::Tensor& out = outs[k];
    if (!plain_cpu(v) || !plain_cpu(out) || !v.storage().is_alias_of(src.storage()))
      throw std::invalid_argument("view copy: a view that is not of the source");
    if (v.scalar_type() != src.scalar_type() || out.scalar_type() != src.scalar_type())
      throw std::invalid_argument("view copy: dtypes differ");
    if (!out.sizes().equals(v.sizes()) || !out.is_contiguous())
      throw std::invalid_argument("view copy: the output is not a contiguous tensor of the view's shape");
    ViewCopy::Part p;
    p.out = out;
    p.out_sizes.assign(out.sizes().begin(), out.sizes().end());
    p.offset = v.storage_offset() - src.storage_offset();
    p.numel = v.numel();
    int64_t last = 0;
    for (int64_t d = 0; d < v.dim(); ++d) {
      if (v.stride(d) < 0) throw std::invalid_argument("view copy: a negative stride");
      last += (v.size(d) - 1) * v.stride(d);
    }
    if (p.offset < 0) throw std::invalid_argument("view copy: a view before the source's start");
    p.extent = p.numel > 0 ? p.offset + last + 1 : p.offset;
    merge_dims(v, p.sizes, p.strides);
    if (p.sizes.size() > 16) throw std::invalid_argument("view copy: more than 16 dimensions");
    total += p.numel;
    copy.parts.push_back(std::move(p));
  }
  if (total > kSmallCopyElements) throw std::invalid_argument("view copy: too many elements for a small copy");
  return copy;
}

bool run_view_copy(const ViewCopy& copy) {
  const at::Tensor& src = copy.src;
  if (!src.sizes().equals(copy.src_sizes) || !src.strides().equals(copy.src_strides)) return false;
  const size_t es = src.element_size();
  const char* base = static_cast<const char*>(src.const_data_ptr());
  if (base == nullptr && src.numel() > 0) return false;
  const auto b = reinterpret_cast<uintptr_t>(base);
  for (const auto& p : copy.parts) {  // every check before any copy
    if (p.out.scalar_type() != src.scalar_type() || !p.out.sizes().equals(p.out_sizes) || !p.out.is_contiguous())
      return false;
    if (p.numel == 0) continue;
    const uintptr_t o = address(p.out);
    if (!apart(o, o + p.numel * es, b + p.offset * es, b + p.extent * es)) return false;
  }
  for (const auto& p : copy.parts) {
    if (p.numel > 0) copy_part(p, base, es);
    p.out.unsafeGetTensorImpl()->bump_version();  // as ATen's out-variant does
  }
  return true;
}

namespace {

// y[j] += sum_k h[k] * w[k * ldw + j]: the weight's rows added in turn (the baseline loop).
void gemv_rows_plain(const float* h, const float* w, int64_t ldw, int64_t K, int64_t N, float* y) {
  for (int64_t k = 0; k < K; ++k) {
    const float a = h[k];
    const float* row = w + k * ldw;
    for (int64_t j = 0; j < N; ++j) y[j] += a * row[j];
  }
}

// y[j] += sum_k h[k] * w[j * ldw + k]: one dot product per output (the baseline loop).
void gemv_cols_plain(const float* h, const float* w, int64_t ldw, int64_t K, int64_t N, float* y) {
  for (int64_t j = 0; j < N; ++j) {
    const float* col = w + j * ldw;
    float sum = 0.0f;
    for (int64_t k = 0; k < K; ++k) sum += h[k] * col[k];
    y[j] += sum;
  }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ETLAB_X86 1
// The product streams the weight once (256 KB for an LSTM's 128 x 512 recurrent matrix): the loops keep
// 128 outputs (rows) or 4 dot products (columns) in registers so that loads of the weight are all they wait on.
// `kVectors` x 16 outputs of y += h W in registers over all of K.
template <int kVectors>
__attribute__((target("avx512f"))) inline void gemv_rows_block(const float* h, const float* w, int64_t ldw,
                                                               int64_t K, float* y) {
  __m512 acc[kVectors];
  for (int i = 0; i < kVectors; ++i) acc[i] = _mm512_loadu_ps(y + 16 * i);
  for (int64_t k = 0; k < K; ++k) {
    const __m512 a = _mm512_set1_ps(h[k]);
    const float* row = w + k * ldw;
    for (int i = 0; i < kVectors; ++i) acc[i] = _mm512_fmadd_ps(a, _mm512_loadu_ps(row + 16 * i), acc[i]);
  }
  for (int i = 0; i < kVectors; ++i) _mm512_storeu_ps(y + 16 * i, acc[i]);
}

__attribute__((target("avx512f"))) void gemv_rows_avx512(const float* h, const float* w, int64_t ldw, int64_t K,
                                                         int64_t N, float* y) {
  int64_t j = 0;
  // 256 outputs at a time (16 of the 32 registers): ~8% faster than 128 on a 128 x 512 weight
  for (; j + 256 <= N; j += 256) gemv_rows_block<16>(h, w + j, ldw, K, y + j);
  for (; j + 128 <= N; j += 128) gemv_rows_block<8>(h, w + j, ldw, K, y + j);
  for (; j + 16 <= N; j += 16) {
    __m512 acc = _mm512_loadu_ps(y + j);
    for (int64_t k = 0; k < K; ++k) acc = _mm512_fmadd_ps(_mm512_set1_ps(h[k]), _mm512_loadu_ps(w + k * ldw + j), acc);
    _mm512_storeu_ps(y + j, acc);
  }
  if (j < N) gemv_rows_plain(h, w + j, ldw, K, N - j, y + j);
}

__attribute__((target("avx512f"))) void gemv_cols_avx512(const float* h, const float* w, int64_t ldw, int64_t K,
                                                         int64_t N, float* y) {
  const int64_t K16 = K - K % 16;
  int64_t j = 0;
  for (; j + 4 <= N; j += 4) {
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t k = 0; k < K16; k += 16) {
      const __m512 x = _mm512_loadu_ps(h + k);
      for (int i = 0; i < 4; ++i) acc[i] = _mm512_fmadd_ps(x, _mm512_loadu_ps(w + (j + i) * ldw + k), acc[i]);
    }
    for (int i = 0; i < 4; ++i) {
      float sum = _mm512_reduce_add_ps(acc[i]);
      for (int64_t k = K16; k < K; ++k) sum += h[k] * w[(j + i) * ldw + k];
      y[j + i] += sum;
    }
  }
  if (j < N) gemv_cols_plain(h, w + j * ldw, ldw, K, N - j, y + j);
}

__attribute__((target("avx2,fma"))) void gemv_rows_avx2(const float* h, const float* w, int64_t ldw, int64_t K,
                                                        int64_t N, float* y) {
  int64_t j = 0;
  for (; j + 64 <= N; j += 64) {
    __m256 acc[8];
    for (int i = 0; i < 8; ++i) acc[i] = _mm256_loadu_ps(y + j + 8 * i);
    for (int64_t k = 0; k < K; ++k) {
      const __m256 a = _mm256_set1_ps(h[k]);
      const float* row = w + k * ldw + j;
      for (int i = 0; i < 8; ++i) acc[i] = _mm256_fmadd_ps(a, _mm256_loadu_ps(row + 8 * i), acc[i]);
    }
    for (int i = 0; i < 8; ++i) _mm256_storeu_ps(y + j + 8 * i, acc[i]);
  }
  if (j < N) gemv_rows_plain(h, w + j, ldw, K, N - j, y + j);
}

using Isa = CpuIsa;
Isa isa() { return cpu_isa(); }
#endif

#ifdef ETLAB_X86
// ATen's own vector math (SLEEF, in libtorch_cpu): its float sigmoid and tanh compute 1 / (1 + exp(-x)) and
// tanh(x) with these on two vectors at a time, and the remaining elements with std::exp / std::tanh.
extern "C" {
__m512 Sleef_expf16_u10(__m512);
__m512 Sleef_tanhf16_u10(__m512);
__m256 Sleef_expf8_u10(__m256);
__m256 Sleef_tanhf8_u10(__m256);
}

__attribute__((target("avx512f"))) int64_t sigmoid_avx512(const float* x, float* o, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512i sign = _mm512_set1_epi32(static_cast<int>(0x80000000u));
  // -x by its sign bit, as ATen negates (0 - x would keep a NaN's sign)
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m512 a = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(_mm512_loadu_ps(x + i)), sign));
    __m512 b = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(_mm512_loadu_ps(x + i + 16)), sign));
    a = _mm512_div_ps(one, _mm512_add_ps(Sleef_expf16_u10(a), one));
    b = _mm512_div_ps(one, _mm512_add_ps(Sleef_expf16_u10(b), one));
    _mm512_storeu_ps(o + i, a);
    _mm512_storeu_ps(o + i + 16, b);
  }
  return i;
}

__attribute__((target("avx512f"))) int64_t tanh_avx512(const float* x, float* o, int64_t n) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 a = Sleef_tanhf16_u10(_mm512_loadu_ps(x + i));
    const __m512 b = Sleef_tanhf16_u10(_mm512_loadu_ps(x + i + 16));
    _mm512_storeu_ps(o + i, a);
    _mm512_storeu_ps(o + i + 16, b);
  }
  return i;
}

__attribute__((target("avx2,fma"))) int64_t sigmoid_avx2(const float* x, float* o, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256 a = _mm256_xor_ps(_mm256_loadu_ps(x + i), sign);
    __m256 b = _mm256_xor_ps(_mm256_loadu_ps(x + i + 8), sign);
    a = _mm256_div_ps(one, _mm256_add_ps(Sleef_expf8_u10(a), one));
    b = _mm256_div_ps(one, _mm256_add_ps(Sleef_expf8_u10(b), one));
    _mm256_storeu_ps(o + i, a);
    _mm256_storeu_ps(o + i + 8, b);
  }
  return i;
}

__attribute__((target("avx512f"))) int64_t exp_avx512(const float* x, float* o, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(o + i, Sleef_expf16_u10(_mm512_loadu_ps(x + i)));
  return i;
}

__attribute__((target("avx2,fma"))) int64_t exp_avx2(const float* x, float* o, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(o + i, Sleef_expf8_u10(_mm256_loadu_ps(x + i)));
  return i;
}

__attribute__((target("avx2,fma"))) int64_t tanh_avx2(const float* x, float* o, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 a = Sleef_tanhf8_u10(_mm256_loadu_ps(x + i));
    const __m256 b = Sleef_tanhf8_u10(_mm256_loadu_ps(x + i + 8));
    _mm256_storeu_ps(o + i, a);
    _mm256_storeu_ps(o + i + 8, b);
  }
  return i;
}
#endif

void gemv_rows(const float* h, const float* w, int64_t ldw, int64_t K, int64_t N, float* y) {
#ifdef ETLAB_X86
  if (isa() == Isa::Avx512) return gemv_rows_avx512(h, w, ldw, K, N, y);
  if (isa() == Isa::Avx2) return gemv_rows_avx2(h, w, ldw, K, N, y);
#endif
  gemv_rows_plain(h, w, ldw, K, N, y);
}

void gemv_cols(const float* h, const float* w, int64_t ldw, int64_t K, int64_t N, float* y) {
#ifdef ETLAB_X86
  if (isa() == Isa::Avx512) return gemv_cols_avx512(h, w, ldw, K, N, y);
#endif
  gemv_cols_plain(h, w, ldw, K, N, y);
}

bool dense_float(const at::Tensor& t) { return t.scalar_type() == at::kFloat && plain_cpu(t); }

}  // namespace

bool run_gemv(const at::Tensor* bias, const at::Tensor& mat1, const at::Tensor& mat2, const at::Tensor& out) {
  if (mat1.dim() != 2 || mat2.dim() != 2 || out.dim() != 2 || mat1.size(0) != 1) return false;
  const int64_t K = mat1.size(1), N = mat2.size(1);
  if (mat2.size(0) != K || out.size(0) != 1 || out.size(1) != N || K == 0 || N == 0) return false;
  if (!dense_float(mat1) || !dense_float(mat2) || !dense_float(out)) return false;
  // ATen splits larger products over threads
  if (K * N > kSmallCopyElements && at::get_num_threads() > 1) return false;
  if (mat1.stride(1) != 1 && K != 1) return false;
  if (out.stride(1) != 1 && N != 1) return false;
  const bool rows = mat2.stride(1) == 1 && mat2.stride(0) >= N;
  const bool cols = !rows && mat2.stride(0) == 1 && mat2.stride(1) >= K;
  if (!rows && !cols) return false;
  const auto o = span(out);
  if (!apart(o.first, o.second, span(mat1).first, span(mat1).second) ||
      !apart(o.first, o.second, span(mat2).first, span(mat2).second))
    return false;
  const float* b = nullptr;
  if (bias != nullptr) {
    if (!dense_float(*bias) || bias->numel() != N || !bias->is_contiguous()) return false;
    if (!(bias->dim() == 1 || (bias->dim() == 2 && bias->size(0) == 1))) return false;
    if (!apart(o.first, o.second, span(*bias).first, span(*bias).second)) return false;
    b = bias->const_data_ptr<float>();
  }
  float* y = out.mutable_data_ptr<float>();
  if (b != nullptr) {
    std::memcpy(y, b, static_cast<size_t>(N) * sizeof(float));
  } else {
    std::fill(y, y + N, 0.0f);
  }
  const float* h = mat1.const_data_ptr<float>();
  const float* w = mat2.const_data_ptr<float>();
  if (rows) {
    gemv_rows(h, w, mat2.stride(0), K, N, y);
  } else {
    gemv_cols(h, w, mat2.stride(1), K, N, y);
  }
  out.unsafeGetTensorImpl()->bump_version();
  return true;
}

void gemv_floats(const float* h, const float* w, int64_t ldw, int64_t K, int64_t N, float* y, bool rows) {
  if (rows) {
    gemv_rows(h, w, ldw, K, N, y);
  } else {
    gemv_cols(h, w, ldw, K, N, y);
  }
}

// The elementwise loops of the core's add/sub/mul/div (one IEEE operation per element, whatever the vector width:
// the same bits as ATen's loop), in blocks of constant length the compiler vectorizes.
template <class Op>
inline void blocks(const float* p, const float* q, float* o, int64_t n, Op op) {
  constexpr int64_t kBlock = 16;
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    float r[kBlock];
    for (int64_t k = 0; k < kBlock; ++k) r[k] = op(p[i + k], q[i + k]);
    for (int64_t k = 0; k < kBlock; ++k) o[i + k] = r[k];  // after every read: o may be p or q
  }
  for (; i < n; ++i) o[i] = op(p[i], q[i]);
}

ETLAB_CLONES void add_floats(const float* p, const float* q, float* o, int64_t n) {
  blocks(p, q, o, n, [](float a, float b) { return a + b; });
}
ETLAB_CLONES void sub_floats(const float* p, const float* q, float* o, int64_t n) {
  blocks(p, q, o, n, [](float a, float b) { return a - b; });
}
ETLAB_CLONES void mul_floats(const float* p, const float* q, float* o, int64_t n) {
  blocks(p, q, o, n, [](float a, float b) { return a * b; });
}
ETLAB_CLONES void div_floats(const float* p, const float* q, float* o, int64_t n) {
  blocks(p, q, o, n, [](float a, float b) { return a / b; });
}
ETLAB_CLONES void mul_scalar_floats(const float* p, float s, float* o, int64_t n) {
  for (int64_t i = 0; i < n; ++i) o[i] = p[i] * s;
}

bool sigmoid_floats(const float* x, float* o, int64_t n) {
  int64_t i = 0;
#ifdef ETLAB_X86
  if (isa() == Isa::Avx512) {
    i = sigmoid_avx512(x, o, n);
  } else if (isa() == Isa::Avx2) {
    i = sigmoid_avx2(x, o, n);
  } else {
    return false;
  }
#else
  return false;
#endif
  for (; i < n; ++i) o[i] = 1.0f / (1.0f + std::exp(-x[i]));
  return true;
}

namespace {
// ATen's float tanh on a contiguous run is MKL's vector tanh where torch has MKL (vmsTanh, high accuracy,
// denormals kept, errors ignored), found in the already-loaded libtorch_cpu; else its SLEEF loop.
using VmsTanh = void (*)(int, const float*, float*, long long);
constexpr long long kVmlMode = 0x2 | 0x140000 | 0x100;  // VML_HA | VML_FTZDAZ_OFF | VML_ERRMODE_IGNORE
VmsTanh mkl_tanh() {
  static const VmsTanh found = reinterpret_cast<VmsTanh>(torch_cpu_symbol("vmsTanh"));
  return found;
}
}  // namespace

CpuIsa cpu_isa() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const CpuIsa found = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return CpuIsa::Avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return CpuIsa::Avx2;
    return CpuIsa::Plain;
  }();
  return found;
#else
  return CpuIsa::Plain;
#endif
}

void* torch_cpu_symbol(const char* name) {
  static void* const lib = dlopen("libtorch_cpu.so", RTLD_LAZY | RTLD_NOLOAD);
  return lib == nullptr ? nullptr : dlsym(lib, name);
}

bool tanh_floats(const float* x, float* o, int64_t n) {
  if (const VmsTanh vml = mkl_tanh(); vml != nullptr && n <= INT32_MAX) {
    vml(static_cast<int>(n), x, o, kVmlMode);
    return true;
  }
  int64_t i = 0;
#ifdef ETLAB_X86
  if (isa() == Isa::Avx512) {
    i = tanh_avx512(x, o, n);
  } else if (isa() == Isa::Avx2) {
    i = tanh_avx2(x, o, n);
  } else {
    return false;
  }
#else
  return false;
#endif
  for (; i < n; ++i) o[i] = std::tanh(x[i]);
  return true;
}

void exp_floats(const float* x, float* o, int64_t n) {
  int64_t i = 0;
#ifdef ETLAB_X86
  if (isa() == Isa::Avx512) {
    i = exp_avx512(x, o, n);
  } else if (isa() == Isa::Avx2) {
    i = exp_avx2(x, o, n);
  }
#endif
  for (; i < n; ++i) o[i] = std::exp(x[i]);
}

}  // namespace etlab_native
