// Float convolutions and fully connected layers with their weights packed once, at load, and no per-call
// set-up: what the XNNPACK host backend (etlab/runtime/backends/xnnpack/_prepacked.py) runs its
// constant-weight nodes on. Activations are NHWC (XNNPACK's layout), the bias and XNNPACK's fused output
// clamp are applied in the same pass as the result is written.
//
// - pointwise (1x1, stride 1, no padding) convolutions and fully connected layers: one GEMM of the
//   activation rows against the weight packed once in MKL's own layout (cblas_sgemm_pack /
//   cblas_sgemm_compute, found in the already-loaded libtorch_cpu, which links MKL), in blocks of rows so
//   the bias + clamp pass reads a block still in cache;
// - depthwise convolutions (one filter per channel): a direct NHWC loop, AVX-512 or AVX2 where the CPU has
//   them, else plain C++;
// - other ungrouped convolutions: the rows of the patch matrix (im2col) made a block at a time into a
//   reusable scratch buffer, then the same packed GEMM.
// Anything else (grouped convolutions that are not depthwise, a torch without MKL) is not taken: the
// factories return nullptr and the caller keeps its other path.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace etlab_native {

// y[M, N] = clamp(x[M, K] * W^T + bias) with W [N, K] packed once for the row counts it is declared for.
class PackedGemm {
 public:
  // nullptr when neither the AVX-512 kernel nor MKL's packed GEMM is available. `rows`: the row count runs are
  // expected to have.
  static std::unique_ptr<PackedGemm> make(const at::Tensor& weight_nk, int64_t rows);
  int64_t k() const { return k_; }
  int64_t n() const { return n_; }
  int64_t block() const { return block_; }
  // Rows [0, m) of the output; `fill(r0, r1, scratch)` returns the address of rows [r0, r1) of the left
  // operand (lda = K), which it may write into `scratch` (room for block() rows when `patches`, else nullptr).
  template <class Fill>
  void run(int64_t m, float* y, const float* bias, float lo, float hi, bool patches, Fill&& fill) const;

 private:
  void block_gemm(const float* a, int64_t rows, float* y) const;
  int64_t k_ = 0, n_ = 0, block_ = 0;
  at::Tensor panels_;               // AVX-512 CPUs: W in panels of 32 outputs, [ceil(N / 32), K, 32] (conv.cpp)
  at::Tensor weight_;               // [K, N] contiguous: for rows no packing was made for
  std::vector<int64_t> packed_rows_;  // the row counts packed for
  std::vector<at::Tensor> packed_;    // MKL's packed B for each of them
};

// The last result a kernel returned, handed out again once nobody holds it (nor a view of it): a fresh tensor
// of a few MB per call is memory the C library gives back to the system between calls (a page fault per 4 KiB
// on the next call: a 112x112x96 result took 4x its GEMM's time), and a kept one stays in cache.
class OutputCache {
 public:
  at::Tensor get(at::IntArrayRef sizes, const at::TensorOptions& options) const;

 private:
  mutable std::mutex mutex_;
  mutable at::Tensor last_;
};

// The widest instruction set the float kernels use from now on (0 plain C++ and MKL's GEMM, 1 AVX2 and MKL's GEMM,
// 2 AVX-512 and the own GEMM), capped at what the CPU has; returns the form now in use. For tests of every form.
int packed_float_isa(int widest);

struct ConvGeometry {
  int64_t kh = 1, kw = 1, stride_h = 1, stride_w = 1, dilation_h = 1, dilation_w = 1;
  int64_t pad_left = 0, pad_right = 0, pad_top = 0, pad_bottom = 0, groups = 1;
};

// A convolution with its weights packed: run(x NHWC) -> NHWC result.
class PackedConv2d {
 public:
  // weight OIHW (float32, [O, I/groups, KH, KW]), bias [O] or undefined, clamp bounds (-inf/inf: none),
  // the input's declared NCHW shape; nullptr for convolutions this file does not take.
  static std::shared_ptr<PackedConv2d> make(const at::Tensor& weight, const at::Tensor& bias, const ConvGeometry& g,
                                            double lo, double hi, const std::vector<int64_t>& input_nchw);
  // The result of x (NHWC float32, any strides) with the clamp (`fused`) or without it.
  at::Tensor run(const at::Tensor& x, bool fused) const;
  const std::string& kind() const { return kind_; }

 private:
  std::string kind_;  // "pointwise", "depthwise", "im2col"
  ConvGeometry g_;
  int64_t in_channels_ = 0, out_channels_ = 0;
  float lo_ = 0, hi_ = 0;
  at::Tensor bias_;      // [O] float32 or undefined
  at::Tensor dw_weight_;  // depthwise: [KH*KW, C]
  std::unique_ptr<PackedGemm> gemm_;
  OutputCache output_;
};

// A fully connected layer: run(x [..., K]) -> [..., N].
class PackedLinear {
 public:
  // weight [N, K] float32; nullptr when MKL's packed GEMM is not available.
  static std::shared_ptr<PackedLinear> make(const at::Tensor& weight, const at::Tensor& bias, double lo, double hi,
                                            int64_t rows);
  at::Tensor run(const at::Tensor& x, bool fused) const;

 private:
  float lo_ = 0, hi_ = 0;
  at::Tensor bias_;
  std::unique_ptr<PackedGemm> gemm_;
  OutputCache output_;
};

}  // namespace etlab_native
