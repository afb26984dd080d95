// A decomposed LSTM cell run as one native step (lstm.h).
//
// Edge writes each time step of an LSTM as twelve instructions: the recurrent product (addmm.out or mm.out on
// B rows), its sum with the time step's input projection (add.out), the split into four gates, three sigmoids and
// a tanh, two products and a sum for the new cell state, its tanh and the product giving the new hidden state.
// Through the core each is a step of its own (a few hundred ns of dispatch and checks on 128 floats); eager
// PyTorch runs the whole cell in oneDNN's fused LSTM. Here the product goes into a scratch row per batch row
// (small.cpp's matrix-vector loops: the sums of the core's one-row addmm), and one loop over the hidden units
// computes the gates and both states in registers: none of the 13 intermediate tensors is written (the plan,
// `_lstm_cells.py`, fuses a cell only when nothing else reads them).
//
// Numerics: the product and every add and multiply are the decomposed steps' own IEEE operations, in the same
// order (no fused multiply-add: this file is compiled without contraction); sigmoid is 1 / (1 + exp(-x)) with
// ATen's SLEEF exp (as the core's sigmoid), tanh SLEEF's (1 ulp; the core's tanh is MKL's vmsTanh, which costs
// ~0.3 us a call on 128 floats). Elements past the last whole vector run through the same vector code on padded
// lanes, where ATen uses std::exp / std::tanh. So the results lie within a few ulps of the decomposed steps'.
#include "lstm.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "small.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define ETLAB_LSTM_X86 1
#endif

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#elif defined(__clang__)
#pragma clang fp contract(off)
#endif

namespace etlab_native {

namespace {

void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("LSTM cell: " + what);
}

bool dense_float(const at::Tensor& t) { return plain_cpu(t) && t.scalar_type() == at::kFloat && t.is_contiguous(); }

uintptr_t address(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.const_data_ptr()); }

// Byte ranges of two dense tensors: the same start (an in-place update, element by element) or apart.
bool same_or_apart(const at::Tensor& a, const at::Tensor& b) {
  const uintptr_t x = address(a), y = address(b);
  const auto nx = static_cast<uintptr_t>(a.numel()) * sizeof(float), ny = static_cast<uintptr_t>(b.numel()) * sizeof(float);
  return x == y || x + nx <= y || y + ny <= x;
}

bool apart(const at::Tensor& a, const at::Tensor& b) { return address(a) != address(b) && same_or_apart(a, b); }

#ifdef ETLAB_LSTM_X86
extern "C" {
__m512 Sleef_expf16_u10(__m512);
__m512 Sleef_tanhf16_u10(__m512);
__m256 Sleef_expf8_u10(__m256);
__m256 Sleef_tanhf8_u10(__m256);
}

// One vector of hidden units: `g` the four gates' sums (`stride` floats apart), `c` the cell state.
__attribute__((target("avx512f"))) inline void cell_avx512(const float* g, int64_t stride, const float* c,
                                                           float* c_out, float* h_out) {
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512i sign = _mm512_set1_epi32(static_cast<int>(0x80000000u));
  auto gate = [&](int q) { return _mm512_loadu_ps(g + q * stride); };
  auto sigmoid = [&](__m512 v) {  // -v by its sign bit, as ATen negates
    v = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(v), sign));
    return _mm512_div_ps(one, _mm512_add_ps(Sleef_expf16_u10(v), one));
  };
  const __m512 i = sigmoid(gate(0)), f = sigmoid(gate(1)), u = Sleef_tanhf16_u10(gate(2)), o = sigmoid(gate(3));
  const __m512 cn = _mm512_add_ps(_mm512_mul_ps(f, _mm512_loadu_ps(c)), _mm512_mul_ps(i, u));
  _mm512_storeu_ps(c_out, cn);
  _mm512_storeu_ps(h_out, _mm512_mul_ps(o, Sleef_tanhf16_u10(cn)));
}

__attribute__((target("avx2,fma"))) inline void cell_avx2(const float* g, int64_t stride, const float* c,
                                                          float* c_out, float* h_out) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  auto gate = [&](int q) { return _mm256_loadu_ps(g + q * stride); };
  auto sigmoid = [&](__m256 v) {
    return _mm256_div_ps(one, _mm256_add_ps(Sleef_expf8_u10(_mm256_xor_ps(v, sign)), one));
  };
  const __m256 i = sigmoid(gate(0)), f = sigmoid(gate(1)), u = Sleef_tanhf8_u10(gate(2)), o = sigmoid(gate(3));
  const __m256 cn = _mm256_add_ps(_mm256_mul_ps(f, _mm256_loadu_ps(c)), _mm256_mul_ps(i, u));
  _mm256_storeu_ps(c_out, cn);
  _mm256_storeu_ps(h_out, _mm256_mul_ps(o, Sleef_tanhf8_u10(cn)));
}

// One batch row of H hidden units, `kLanes` at a time; the last partial vector is copied into padded lanes.
template <int kLanes, class Block>
inline void cell_row(const float* g, const float* c, float* c_out, float* h_out, int64_t H, Block block) {
  int64_t j = 0;
  for (; j + kLanes <= H; j += kLanes) block(g + j, H, c + j, c_out + j, h_out + j);
  if (j == H) return;
  const auto n = static_cast<size_t>(H - j);
  alignas(64) float lg[4 * kLanes] = {}, lc[kLanes] = {}, lco[kLanes], lho[kLanes];
  for (int q = 0; q < 4; ++q) std::memcpy(lg + q * kLanes, g + q * H + j, n * sizeof(float));
  std::memcpy(lc, c + j, n * sizeof(float));
  block(lg, kLanes, lc, lco, lho);
  std::memcpy(c_out + j, lco, n * sizeof(float));
  std::memcpy(h_out + j, lho, n * sizeof(float));
}

__attribute__((target("avx512f"))) void row_avx512(const float* g, const float* c, float* c_out, float* h_out,
                                                   int64_t H) {
  cell_row<16>(g, c, c_out, h_out, H, cell_avx512);
}

__attribute__((target("avx2,fma"))) void row_avx2(const float* g, const float* c, float* c_out, float* h_out,
                                                  int64_t H) {
  cell_row<8>(g, c, c_out, h_out, H, cell_avx2);
}
#endif

// The load-time shape of a captured tensor still holds (a Move may re-point a tensor, never re-shape a planned one,
// but the check costs a few compares).
bool still(const at::Tensor& t, int64_t numel) { return t.numel() == numel && dense_float(t); }

}  // namespace

LstmCell make_lstm_cell(std::optional<at::Tensor> bias, at::Tensor h, at::Tensor w, at::Tensor x, at::Tensor c,
                        at::Tensor c_out, at::Tensor h_out, int64_t span) {
#ifdef ETLAB_LSTM_X86
  require(cpu_isa() != CpuIsa::Plain, "this CPU has neither AVX2 nor AVX-512");
#else
  require(false, "only built for x86-64");
#endif
  require(h.dim() == 2 && w.dim() == 2, "h must be (B, K) and the weight (K, 4H)");
  const int64_t B = h.size(0), K = h.size(1), N = w.size(1);
  require(B >= 1 && K >= 1 && w.size(0) == K && N >= 4 && N % 4 == 0, "the weight must be (K, 4H) for h (B, K)");
  const int64_t H = N / 4;
  require(dense_float(h) && plain_cpu(w) && w.scalar_type() == at::kFloat, "h and the weight must be float32");
  require((w.stride(1) == 1 && w.stride(0) >= N) || (w.stride(0) == 1 && w.stride(1) >= K),
          "the weight's rows or columns must be contiguous");
  if (bias) require(dense_float(*bias) && bias->numel() == N, "the bias must be 4H float32");
  require(dense_float(x) && x.numel() == B * N, "the input projection must be B x 4H float32");
  for (const at::Tensor* t : {&c, &c_out, &h_out})
    require(dense_float(*t) && t->numel() == B * H, "the states must be B x H float32");
  LstmCell cell;
  cell.bias = std::move(bias);
  cell.h = std::move(h);
  cell.w = std::move(w);
  cell.x = std::move(x);
  cell.c = std::move(c);
  cell.c_out = std::move(c_out);
  cell.h_out = std::move(h_out);
  cell.rows = B;
  cell.k = K;
  cell.hidden = H;
  cell.span = span;
  cell.gates.resize(static_cast<size_t>(B * N));
  return cell;
}

bool run_lstm_cell(LstmCell& cell) {
#ifdef ETLAB_LSTM_X86
  const int64_t B = cell.rows, K = cell.k, H = cell.hidden, N = 4 * H;
  // ATen splits larger products over threads (as run_gemv leaves them to it)
  if (K * N > kSmallCopyElements && at::get_num_threads() > 1) return false;
  const at::Tensor& w = cell.w;
  if (!plain_cpu(w) || w.scalar_type() != at::kFloat || w.dim() != 2 || w.size(0) != K || w.size(1) != N) return false;
  const bool rows = w.stride(1) == 1 && w.stride(0) >= N;
  if (!rows && !(w.stride(0) == 1 && w.stride(1) >= K)) return false;
  if (!still(cell.h, B * K) || !still(cell.x, B * N) || !still(cell.c, B * H) || !still(cell.c_out, B * H) ||
      !still(cell.h_out, B * H) || (cell.bias && !still(*cell.bias, N)))
    return false;
  // h, w, the bias and x are read whole before anything is written; the states are then written element by element
  // as c is read: c may be either output itself (the plan reuses its bytes), nothing else may overlap them
  if (!same_or_apart(cell.c, cell.c_out) || !same_or_apart(cell.c, cell.h_out) || !apart(cell.c_out, cell.h_out))
    return false;
  float* gates = cell.gates.data();
  const float* h = cell.h.const_data_ptr<float>();
  const float* wp = w.const_data_ptr<float>();
  const int64_t ldw = rows ? w.stride(0) : w.stride(1);
  const float* x = cell.x.const_data_ptr<float>();
  for (int64_t b = 0; b < B; ++b) {  // (bias + h w) + x: the decomposed steps' order
    float* y = gates + b * N;
    if (cell.bias) {
      std::memcpy(y, cell.bias->const_data_ptr<float>(), static_cast<size_t>(N) * sizeof(float));
    } else {
      std::fill(y, y + N, 0.0f);
    }
    gemv_floats(h + b * K, wp, ldw, K, N, y, rows);
    add_floats(y, x + b * N, y, N);
  }
  const float* c = cell.c.const_data_ptr<float>();
  float* c_out = cell.c_out.mutable_data_ptr<float>();
  float* h_out = cell.h_out.mutable_data_ptr<float>();
  const bool wide = cpu_isa() == CpuIsa::Avx512;
  for (int64_t b = 0; b < B; ++b) {
    if (wide) {
      row_avx512(gates + b * N, c + b * H, c_out + b * H, h_out + b * H, H);
    } else {
      row_avx2(gates + b * N, c + b * H, c_out + b * H, h_out + b * H, H);
    }
  }
  cell.c_out.unsafeGetTensorImpl()->bump_version();  // as the out-variants do
  cell.h_out.unsafeGetTensorImpl()->bump_version();
  return true;
#else
  (void)cell;
  return false;
#endif
}

}  // namespace etlab_native
