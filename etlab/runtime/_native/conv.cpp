// Packed float convolutions and fully connected layers (see conv.h).
#include "conv_internal.h"

#include <ATen/Parallel.h>

#include "small.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

namespace etlab_native {

using namespace conv_detail;  // the depthwise kernels (conv_depthwise.cpp), the vector forms (conv_internal.h)

#ifdef ETLAB_CONV_X86
// The vector loops (conv_simd_kernels.h) compiled once per instruction set, for the bias + clamp pass.
namespace conv_detail __attribute__((visibility("hidden"))) {
#include "conv_simd_forms.h"
}  // namespace conv_detail
#endif

namespace {

// MKL's CBLAS constants and entry points (mkl_cblas.h; MKL_INT is int in the LP64 interface torch links; the
// lower-case mkl_set_num_threads_local symbol is the Fortran entry, taking a pointer: the C one is MKL_Set_...).
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112, kPacked = 151, kBMatrix = 162;
using PackGetSize = size_t (*)(int identifier, int m, int n, int k);
using Pack = void (*)(int layout, int identifier, int trans, int m, int n, int k, float alpha, const float* src, int ld,
                      float* dest);
using Compute = void (*)(int layout, int transa, int transb, int m, int n, int k, const float* a, int lda,
                         const float* b, int ldb, float beta, float* c, int ldc);
using Sgemm = void (*)(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                       const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
                       const float* beta, float* c, const int* ldc);
using SetThreadsLocal = int (*)(int);

struct Mkl {
  PackGetSize pack_get_size = nullptr;
  Pack pack = nullptr;
  Compute compute = nullptr;
  Sgemm sgemm = nullptr;
  SetThreadsLocal set_threads_local = nullptr;
  bool ok() const { return pack_get_size && pack && compute && sgemm && set_threads_local; }
};

const Mkl& mkl() {
  static const Mkl found = [] {
    Mkl m;
    m.pack_get_size = reinterpret_cast<PackGetSize>(torch_cpu_symbol("cblas_sgemm_pack_get_size"));
    m.pack = reinterpret_cast<Pack>(torch_cpu_symbol("cblas_sgemm_pack"));
    m.compute = reinterpret_cast<Compute>(torch_cpu_symbol("cblas_sgemm_compute"));
    m.sgemm = reinterpret_cast<Sgemm>(torch_cpu_symbol("sgemm_"));
    m.set_threads_local = reinterpret_cast<SetThreadsLocal>(torch_cpu_symbol("MKL_Set_Num_Threads_Local"));
    return m;
  }();
  return found;
}

// MKL on this thread uses the runtime's thread count (torch's setting) for the scope's calls.
class MklThreads {
 public:
  MklThreads() : previous_(mkl().set_threads_local(at::get_num_threads())) {}
  ~MklThreads() { mkl().set_threads_local(previous_); }
  MklThreads(const MklThreads&) = delete;
  MklThreads& operator=(const MklThreads&) = delete;

 private:
  int previous_;
};

using Isa = CpuIsa;
std::atomic<int> isa_cap{static_cast<int>(Isa::Avx512)};  // packed_float_isa: the widest form used
Isa isa() {
  return static_cast<Isa>(std::min(static_cast<int>(cpu_isa()), isa_cap.load(std::memory_order_relaxed)));
}

// Output rows per GEMM block: the block's result (~128 KiB) is still in L2 when the bias + clamp pass reads it.
int64_t block_rows(int64_t n, int64_t rows) {
  constexpr int64_t kBlockFloats = 32 * 1024;
  int64_t b = std::max<int64_t>(64, (kBlockFloats / std::max<int64_t>(n, 1) + 15) / 16 * 16);
  return rows <= b + b / 2 ? std::max<int64_t>(rows, 1) : b;
}

// ---- bias + clamp over rows of an output -----------------------------------------------------------------

void epilogue(float* y, int64_t rows, int64_t n, const float* bias, float lo, float hi) {
  const bool clamps = lo != -std::numeric_limits<float>::infinity() || hi != std::numeric_limits<float>::infinity();
  if (bias == nullptr && !clamps) return;
#ifdef ETLAB_CONV_X86
  if (isa() == Isa::Avx512) return avx512::epilogue_rows<Avx512>(y, rows, n, bias, lo, hi);
  if (isa() == Isa::Avx2) return avx2::epilogue_rows<Avx2>(y, rows, n, bias, lo, hi);
#endif
  for (int64_t r = 0; r < rows; ++r) {
    float* row = y + r * n;
    for (int64_t j = 0; j < n; ++j) row[j] = fused_clamp(row[j] + (bias ? bias[j] : 0.0f), lo, hi);
  }
}

// ---- GEMM with the bias and clamp in registers (AVX-512) ---------------------------------------------------
// The weight is packed in panels of 32 outputs ([K][32] each, zeros past N); a tile of MR rows x one panel is
// 2*MR accumulators, started from the bias, one broadcast of the row's input per K step, and written clamped:
// the result is written once, no pass over it afterwards. MKL's packed GEMM (below) is the other CPUs' path.

constexpr int64_t kPanel = 32;

#ifdef ETLAB_CONV_X86
template <int MR, int NV>
__attribute__((target("avx512f"))) inline void gemm_tile_avx512(const float* a, int64_t lda, const float* panel,
                                                                int64_t k, const float* bias, __mmask16 m0,
                                                                __mmask16 m1, float* y, int64_t ldy, __m512 vlo,
                                                                __m512 vhi) {
  __m512 acc[MR][NV];
  const __m512 b0 = bias ? _mm512_maskz_loadu_ps(m0, bias) : _mm512_setzero_ps();
  const __m512 b1 = NV > 1 && bias ? _mm512_maskz_loadu_ps(m1, bias + 16) : _mm512_setzero_ps();
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    acc[i][0] = b0;
    if constexpr (NV > 1) acc[i][1] = b1;
  }
  for (int64_t kk = 0; kk < k; ++kk) {
    const __m512 w0 = _mm512_loadu_ps(panel + kk * kPanel);
    __m512 w1;
    if constexpr (NV > 1) w1 = _mm512_loadu_ps(panel + kk * kPanel + 16);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512 x = _mm512_set1_ps(a[i * lda + kk]);
      acc[i][0] = _mm512_fmadd_ps(x, w0, acc[i][0]);
      if constexpr (NV > 1) acc[i][1] = _mm512_fmadd_ps(x, w1, acc[i][1]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    _mm512_mask_storeu_ps(y + i * ldy, m0, _mm512_min_ps(vhi, _mm512_max_ps(vlo, acc[i][0])));
    if constexpr (NV > 1) _mm512_mask_storeu_ps(y + i * ldy + 16, m1, _mm512_min_ps(vhi, _mm512_max_ps(vlo, acc[i][1])));
  }
}

template <int NV>
__attribute__((target("avx512f"))) void gemm_panel_avx512(const float* a, int64_t rows, int64_t k,
                                                          const float* panel, const float* bias, __mmask16 m0,
                                                          __mmask16 m1, float* y, int64_t ldy, float lo, float hi) {
  const __m512 vlo = _mm512_set1_ps(lo), vhi = _mm512_set1_ps(hi);
  int64_t r = 0;
  for (; r + 8 <= rows; r += 8)
    gemm_tile_avx512<8, NV>(a + r * k, k, panel, k, bias, m0, m1, y + r * ldy, ldy, vlo, vhi);
  if (rows - r >= 4) {
    gemm_tile_avx512<4, NV>(a + r * k, k, panel, k, bias, m0, m1, y + r * ldy, ldy, vlo, vhi);
    r += 4;
  }
  for (; r < rows; ++r) gemm_tile_avx512<1, NV>(a + r * k, k, panel, k, bias, m0, m1, y + r * ldy, ldy, vlo, vhi);
}

// y[rows, n] = clamp(a[rows, k] * W^T + bias) for rows of a block, panel by panel; when all the panels fit in L1
// (a short K), eight rows at a time through every panel instead, so each output row is written whole, in order.
__attribute__((target("avx512f"))) void gemm_avx512(const float* a, int64_t rows, int64_t k, int64_t n,
                                                    const float* panels, const float* bias, float* y, float lo,
                                                    float hi) {
  const int64_t npad = (n + kPanel - 1) / kPanel * kPanel;
  if (rows > 8 && k * npad <= 8192) {
    for (int64_t r = 0; r < rows; r += 8) gemm_avx512(a + r * k, std::min<int64_t>(8, rows - r), k, n, panels, bias,
                                                      y + r * n, lo, hi);
    return;
  }
  for (int64_t p = 0; p * kPanel < n; ++p) {
    const int64_t cols = std::min<int64_t>(kPanel, n - p * kPanel);
    const __mmask16 m0 = cols >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << cols) - 1);
    const __mmask16 m1 = cols >= 32 ? static_cast<__mmask16>(0xFFFF)
                         : cols > 16 ? static_cast<__mmask16>((1u << (cols - 16)) - 1)
                                     : static_cast<__mmask16>(0);
    const float* panel = panels + p * k * kPanel;
    const float* b = bias ? bias + p * kPanel : nullptr;
    if (cols > 16) {
      gemm_panel_avx512<2>(a, rows, k, panel, b, m0, m1, y + p * kPanel, n, lo, hi);
    } else {
      gemm_panel_avx512<1>(a, rows, k, panel, b, m0, m1, y + p * kPanel, n, lo, hi);
    }
  }
}
#endif

// ---- im2col ----------------------------------------------------------------------------------------------

struct Patches {
  const float* x;
  int64_t sn, sh, sw, sc;  // x's strides (elements), NHWC order
  int64_t h, w, c, oh, ow;
  ConvGeometry g;
};

// Rows [r0, r1) of the patch matrix (row = output pixel (n, oy, ox); columns (ky, kx, c), zeros outside the
// input) into `out`.
void patch_rows(const Patches& p, int64_t r0, int64_t r1, float* out) {
  const int64_t K = p.g.kh * p.g.kw * p.c;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t n = r / (p.oh * p.ow), rem = r % (p.oh * p.ow), oy = rem / p.ow, ox = rem % p.ow;
    float* row = out + (r - r0) * K;
    for (int64_t ky = 0; ky < p.g.kh; ++ky) {
      const int64_t iy = oy * p.g.stride_h - p.g.pad_top + ky * p.g.dilation_h;
      for (int64_t kx = 0; kx < p.g.kw; ++kx) {
        float* dst = row + (ky * p.g.kw + kx) * p.c;
        const int64_t ix = ox * p.g.stride_w - p.g.pad_left + kx * p.g.dilation_w;
        if (iy < 0 || iy >= p.h || ix < 0 || ix >= p.w) {
          std::memset(dst, 0, sizeof(float) * p.c);
          continue;
        }
        const float* src = p.x + n * p.sn + iy * p.sh + ix * p.sw;
        if (p.sc == 1) {
          std::memcpy(dst, src, sizeof(float) * p.c);
        } else {
          for (int64_t c = 0; c < p.c; ++c) dst[c] = src[c * p.sc];
        }
      }
    }
  }
}

float* scratch(int64_t floats) {
  thread_local std::vector<float> buffer;
  if (static_cast<int64_t>(buffer.size()) < floats) buffer.resize(floats);
  return buffer.data();
}

bool is_float_cpu(const at::Tensor& t) {
  return t.defined() && t.device().is_cpu() && t.scalar_type() == at::kFloat && t.layout() == at::kStrided;
}

}  // namespace

int packed_float_isa(int widest) {
  isa_cap.store(std::max(0, std::min(widest, static_cast<int>(Isa::Avx512))), std::memory_order_relaxed);
  return static_cast<int>(isa());
}

// ---- OutputCache ---------------------------------------------------------------------------------------

at::Tensor OutputCache::get(at::IntArrayRef sizes, const at::TensorOptions& options) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (last_.defined() && last_.use_count() == 1 && last_.storage().use_count() == 1 && last_.sizes() == sizes &&
      last_.dtype() == options.dtype())
    return last_;
  last_ = at::empty(sizes, options);
  return last_;
}

// ---- PackedGemm ------------------------------------------------------------------------------------------

std::unique_ptr<PackedGemm> PackedGemm::make(const at::Tensor& weight_nk, int64_t rows) {
  const bool avx512 = isa() == Isa::Avx512;
  if ((!avx512 && !mkl().ok()) || !is_float_cpu(weight_nk) || weight_nk.dim() != 2) return nullptr;
  const int64_t n = weight_nk.size(0), k = weight_nk.size(1);
  constexpr int64_t kMax = std::numeric_limits<int>::max() / 2;
  if (n < 1 || k < 1 || rows < 1 || n > kMax || k > kMax || rows > kMax || n * k > kMax) return nullptr;
  auto g = std::unique_ptr<PackedGemm>(new PackedGemm());
  g->k_ = k, g->n_ = n;
  if (avx512) {
    const int64_t panels = (n + kPanel - 1) / kPanel;
    at::Tensor w = at::zeros({panels * kPanel, k}, at::kFloat);
    w.narrow(0, 0, n).copy_(weight_nk);
    g->panels_ = w.reshape({panels, kPanel, k}).transpose(1, 2).contiguous();  // [P, K, 32]
    // rows per block: the block's inputs (~64 KiB) stay in cache while every panel passes over them
    g->block_ = std::max<int64_t>(8, std::min<int64_t>(rows, (16384 / k + 7) / 8 * 8));
    return g;
  }
  g->weight_ = weight_nk.t().contiguous();  // [K, N]: MKL's "N" form for B (its "T" form is slower for small K)
  g->block_ = block_rows(n, rows);
  std::vector<int64_t> sizes{std::min(g->block_, rows)};
  if (rows > g->block_ && rows % g->block_) sizes.push_back(rows % g->block_);
  for (int64_t m : sizes) {
    const size_t bytes = mkl().pack_get_size(kBMatrix, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k));
    at::Tensor packed = at::empty({static_cast<int64_t>(bytes / sizeof(float) + 16)}, at::kFloat);
    mkl().pack(kRowMajor, kBMatrix, kNoTrans, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1.0f,
               g->weight_.data_ptr<float>(), static_cast<int>(n), packed.data_ptr<float>());
    g->packed_rows_.push_back(m);
    g->packed_.push_back(std::move(packed));
  }
  return g;
}

void PackedGemm::block_gemm(const float* a, int64_t rows, float* y) const {
  const int m = static_cast<int>(rows), n = static_cast<int>(n_), k = static_cast<int>(k_);
  for (size_t i = 0; i < packed_rows_.size(); ++i) {
    if (packed_rows_[i] == rows) {
      mkl().compute(kRowMajor, kNoTrans, kPacked, m, n, k, a, k, packed_[i].data_ptr<float>(), n, 0.0f, y, n);
      return;
    }
  }
  // A row count not packed for (a smaller dynamic shape): the plain GEMM, column-major y^T = W * a^T.
  const float one = 1.0f, zero = 0.0f;
  mkl().sgemm("N", "N", &n, &m, &k, &one, weight_.data_ptr<float>(), &n, a, &k, &zero, y, &n);
}

template <class Fill>
void PackedGemm::run(int64_t m, float* y, const float* bias, float lo, float hi, bool patches, Fill&& fill) const {
  float* buffer = patches && m > 0 ? scratch(block_ * k_) : nullptr;
#ifdef ETLAB_CONV_X86
  if (panels_.defined()) {
    const float* panels = panels_.data_ptr<float>();
    for (int64_t r0 = 0; r0 < m; r0 += block_) {
      const int64_t r1 = std::min(m, r0 + block_);
      gemm_avx512(fill(r0, r1, buffer), r1 - r0, k_, n_, panels, bias, y + r0 * n_, lo, hi);
    }
    return;
  }
#endif
  MklThreads threads;
  for (int64_t r0 = 0; r0 < m; r0 += block_) {
    const int64_t r1 = std::min(m, r0 + block_);
    const float* a = fill(r0, r1, buffer);
    block_gemm(a, r1 - r0, y + r0 * n_);
    epilogue(y + r0 * n_, r1 - r0, n_, bias, lo, hi);
  }
}

// ---- PackedConv2d ----------------------------------------------------------------------------------------

std::shared_ptr<PackedConv2d> PackedConv2d::make(const at::Tensor& weight, const at::Tensor& bias,
                                                 const ConvGeometry& g, double lo, double hi,
                                                 const std::vector<int64_t>& input_nchw) {
  if (!is_float_cpu(weight) || weight.dim() != 4 || input_nchw.size() != 4) return nullptr;
  if (bias.defined() && (!is_float_cpu(bias) || bias.dim() != 1 || bias.size(0) != weight.size(0))) return nullptr;
  if (g.kh != weight.size(2) || g.kw != weight.size(3) || g.groups < 1) return nullptr;
  // the geometry comes from a file: a zero stride would divide by zero, a negative pad read before the input
  if (g.stride_h < 1 || g.stride_w < 1 || g.dilation_h < 1 || g.dilation_w < 1 || g.kh < 1 || g.kw < 1 ||
      std::min({g.pad_left, g.pad_right, g.pad_top, g.pad_bottom}) < 0)
    return nullptr;
  const int64_t out_c = weight.size(0), per_group = weight.size(1), in_c = input_nchw[1];
  if (per_group * g.groups != in_c || out_c % g.groups) return nullptr;
  auto conv = std::shared_ptr<PackedConv2d>(new PackedConv2d());
  conv->g_ = g, conv->in_channels_ = in_c, conv->out_channels_ = out_c;
  conv->lo_ = static_cast<float>(lo), conv->hi_ = static_cast<float>(hi);
  if (bias.defined()) conv->bias_ = bias.contiguous().clone();
  const bool no_pad = g.pad_left == 0 && g.pad_right == 0 && g.pad_top == 0 && g.pad_bottom == 0;
  const int64_t oh = (input_nchw[2] + g.pad_top + g.pad_bottom - g.dilation_h * (g.kh - 1) - 1) / g.stride_h + 1;
  const int64_t ow = (input_nchw[3] + g.pad_left + g.pad_right - g.dilation_w * (g.kw - 1) - 1) / g.stride_w + 1;
  if (oh < 1 || ow < 1) return nullptr;
  const int64_t rows = input_nchw[0] * oh * ow;
  if (g.groups == in_c && out_c == in_c && per_group == 1) {
    conv->kind_ = "depthwise";
    conv->dw_weight_ = weight.reshape({out_c, g.kh * g.kw}).t().contiguous();  // [KH*KW, C]
    return conv;
  }
  if (g.groups != 1) return nullptr;
  // OIHW -> [O, KH*KW*I]: the patch columns' order (ky, kx, c)
  conv->gemm_ = PackedGemm::make(weight.permute({0, 2, 3, 1}).reshape({out_c, g.kh * g.kw * in_c}), rows);
  if (!conv->gemm_) return nullptr;
  conv->kind_ = g.kh == 1 && g.kw == 1 && g.stride_h == 1 && g.stride_w == 1 && no_pad ? "pointwise" : "im2col";
  return conv;
}

at::Tensor PackedConv2d::run(const at::Tensor& x_in, bool fused) const {
  TORCH_CHECK(is_float_cpu(x_in) && x_in.dim() == 4 && x_in.size(3) == in_channels_,
              "packed convolution: the input must be a float32 NHWC tensor of ", in_channels_, " channels, got ",
              x_in.sizes());
  const int64_t n = x_in.size(0), h = x_in.size(1), w = x_in.size(2);
  const int64_t oh = (h + g_.pad_top + g_.pad_bottom - g_.dilation_h * (g_.kh - 1) - 1) / g_.stride_h + 1;
  const int64_t ow = (w + g_.pad_left + g_.pad_right - g_.dilation_w * (g_.kw - 1) - 1) / g_.stride_w + 1;
  TORCH_CHECK(oh >= 1 && ow >= 1, "packed convolution: input ", x_in.sizes(), " is smaller than the kernel");
  const float lo = fused ? lo_ : -std::numeric_limits<float>::infinity();
  const float hi = fused ? hi_ : std::numeric_limits<float>::infinity();
  const float* bias = bias_.defined() ? bias_.data_ptr<float>() : nullptr;
  at::Tensor y = output_.get({n, oh, ow, out_channels_}, x_in.options().memory_format(at::MemoryFormat::Contiguous));
  if (kind_ == "im2col") {
    // channels apart in memory (an NCHW tensor seen as NHWC: a graph's input) are gathered once, not per patch,
    // unless the input is small: ATen's copy of a 32x32x3 permuted image has ~6 us of set-up, more than gathering
    // each patch's channels where they are
    const bool gather = x_in.stride(3) != 1 && x_in.numel() <= (int64_t(1) << 14);
    const at::Tensor x = x_in.stride(3) == 1 || gather ? x_in : x_in.contiguous();
    const Patches p{x.data_ptr<float>(), x.stride(0), x.stride(1), x.stride(2), x.stride(3), h, w, in_channels_, oh,
                    ow, g_};
    gemm_->run(n * oh * ow, y.data_ptr<float>(), bias, lo, hi, true, [&](int64_t r0, int64_t r1, float* buffer) {
      patch_rows(p, r0, r1, buffer);
      return static_cast<const float*>(buffer);
    });
    return y;
  }
  const at::Tensor x = x_in.contiguous();
  if (kind_ == "pointwise") {
    const float* a = x.data_ptr<float>();
    const int64_t k = in_channels_;
    gemm_->run(n * h * w, y.data_ptr<float>(), bias, lo, hi, false,
               [&](int64_t r0, int64_t, float*) { return a + r0 * k; });
    return y;
  }
  const DwArgs args{x.data_ptr<float>(), dw_weight_.data_ptr<float>(), bias, y.data_ptr<float>(), h, w,
                    out_channels_, oh, ow, g_, lo, hi};
  const Isa which = isa();
  const int64_t cost = ow * out_channels_ * g_.kh * g_.kw;  // per output row
  at::parallel_for(0, n * oh, std::max<int64_t>(1, 32768 / std::max<int64_t>(cost, 1)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
#ifdef ETLAB_CONV_X86
      if (which == Isa::Avx512) {
        dw_row_avx512(args, r / oh, r % oh);
        continue;
      }
      if (which == Isa::Avx2) {
        dw_row_avx2(args, r / oh, r % oh);
        continue;
      }
#endif
      dw_row_plain(args, r / oh, r % oh);
    }
  });
  return y;
}

// ---- PackedLinear ----------------------------------------------------------------------------------------

std::shared_ptr<PackedLinear> PackedLinear::make(const at::Tensor& weight, const at::Tensor& bias, double lo,
                                                 double hi, int64_t rows) {
  if (!is_float_cpu(weight) || weight.dim() != 2) return nullptr;
  if (bias.defined() && (!is_float_cpu(bias) || bias.dim() != 1 || bias.size(0) != weight.size(0))) return nullptr;
  auto linear = std::shared_ptr<PackedLinear>(new PackedLinear());
  linear->gemm_ = PackedGemm::make(weight, std::max<int64_t>(rows, 1));
  if (!linear->gemm_) return nullptr;
  linear->lo_ = static_cast<float>(lo), linear->hi_ = static_cast<float>(hi);
  if (bias.defined()) linear->bias_ = bias.contiguous().clone();
  return linear;
}

at::Tensor PackedLinear::run(const at::Tensor& x_in, bool fused) const {
  const int64_t k = gemm_->k();
  TORCH_CHECK(is_float_cpu(x_in) && x_in.dim() >= 1 && x_in.size(-1) == k,
              "packed fully connected layer: the input must be float32 with ", k, " features last, got ",
              x_in.sizes());
  const at::Tensor x = x_in.contiguous();
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = gemm_->n();
  at::Tensor y = output_.get(shape, x.options().memory_format(at::MemoryFormat::Contiguous));
  const float lo = fused ? lo_ : -std::numeric_limits<float>::infinity();
  const float hi = fused ? hi_ : std::numeric_limits<float>::infinity();
  const float* a = x.data_ptr<float>();
  gemm_->run(x.numel() / k, y.data_ptr<float>(), bias_.defined() ? bias_.data_ptr<float>() : nullptr, lo, hi, false,
             [&](int64_t r0, int64_t, float*) { return a + r0 * k; });
  return y;
}

}  // namespace etlab_native
