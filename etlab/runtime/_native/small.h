// Kernels the core computes itself on small tensors, where ATen's dispatch, TensorIterator set-up and
// output checks cost more than the work: an unrolled LSTM step is a matrix-vector product, copies of
// slices of a few hundred floats and elementwise ops on 128, each ~1-3 us through ATen and 0.1-1 us
// here. Each kernel returns false (nothing done) for anything it does not cover; the caller then
// makes the ATen call, so a kernel only ever takes the cases it was checked against.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace etlab_native {

// At most this many elements: ATen splits larger loops over threads (at::internal::GRAIN_SIZE), which
// a kernel here never does.
constexpr int64_t kSmallCopyElements = 32768;

// A dense strided CPU tensor with storage and none of the keys that would send a call elsewhere (Python
// subclass or mode, functionalization, lazy negation or conjugation, zero tensor).
bool plain_cpu(const at::Tensor& t);
// The elements of two dense tensors (non-negative strides) lie in disjoint bytes.
bool tensors_apart(const at::Tensor& a, const at::Tensor& b);

// A kernel the core runs on an out-variant's whole argument stack (built at load, one IValue per schema
// parameter): true when it computed the call, false (nothing written) for anything it does not cover.
using SmallFn = bool (*)(const std::vector<c10::IValue>& args);
// The small_ops.cpp kernel for operator `name`.`overload` (add/sub/mul with broadcasts, index.Tensor
// gathers, eq.Scalar, logical_not, any over the last dimension, where, full_like, last-dimension softmax),
// or nullptr. `inexact`: also kernels within float tolerance of ATen's rather than its bits (softmax).
SmallFn small_kernel(const std::string& name, const std::string& overload, bool inexact);
// How many calls each of those kernels computed in this process, by operator ("index.Tensor_out", ...).
std::map<std::string, int64_t> small_kernel_calls();

// A copy of a view of `src` into the contiguous `out` tensors (slice_copy, select_copy, squeeze_copy,
// unsqueeze_copy, view_copy, permute_copy, expand_copy, split_with_sizes_copy, ...): each part is where
// its view lies (element offset from src's data, sizes and strides, adjacent dimensions merged), worked
// out at load by applying the view operator to the source itself. A run copies only while src still has
// the sizes and strides seen at load and each out its own (a rebound source falls back to ATen).
struct ViewCopy {
  struct Part {
    at::Tensor out;
    std::vector<int64_t> out_sizes;
    int64_t offset = 0, extent = 0, numel = 0;  // in elements: the view's first and one past its last element
    std::vector<int64_t> sizes, strides;        // merged; the last dimension the innermost
  };
  at::Tensor src;
  std::vector<int64_t> src_sizes, src_strides;
  std::vector<Part> parts;
};

// Builds a ViewCopy from the source, the view tensors the view operator returned on it and the outputs;
// std::invalid_argument when they do not describe a copy this kernel does (different storage, dtype or
// shape, a non-contiguous output, too many elements).
ViewCopy make_view_copy(const at::Tensor& src, const std::vector<at::Tensor>& views,
                        const std::vector<at::Tensor>& outs);
bool run_view_copy(const ViewCopy& copy);

// addmm.out(bias, mat1, mat2, beta=1, alpha=1, out) and mm.out(mat1, mat2, out) with one row: float,
// mat1 (1, K) contiguous, mat2 (K, N) with either unit stride (a transposed weight Edge wrote out) or
// rows contiguous, out (1, N) contiguous, bias (N) or (1, N) contiguous or absent. The sums run in a
// different order than MKL's (a few ulps apart, as MKL differs from itself across CPUs).
bool run_gemv(const at::Tensor* bias, const at::Tensor& mat1, const at::Tensor& mat2, const at::Tensor& out);
// y += h w for one row of K floats, w (K, N) with its rows `ldw` floats apart (`rows`, unit column stride) or its
// columns `ldw` apart (unit row stride): run_gemv's loops, for kernels that hold raw pointers (lstm.cpp).
void gemv_floats(const float* h, const float* w, int64_t ldw, int64_t K, int64_t N, float* y, bool rows);

// o = p (op) q elementwise over n floats (o may be p or q, or lie apart from both).
void add_floats(const float* p, const float* q, float* o, int64_t n);
void sub_floats(const float* p, const float* q, float* o, int64_t n);
void mul_floats(const float* p, const float* q, float* o, int64_t n);
void div_floats(const float* p, const float* q, float* o, int64_t n);
// o = p * s over n floats (o may be p).
void mul_scalar_floats(const float* p, float s, float* o, int64_t n);

// o = sigmoid(x) / tanh(x) over n floats as ATen computes them on this CPU (its vector math on blocks of two
// vectors, std::exp / std::tanh on the rest); false (nothing done) on a CPU without AVX2.
bool sigmoid_floats(const float* x, float* o, int64_t n);
bool tanh_floats(const float* x, float* o, int64_t n);
// o = exp(x) over n floats (o may be x) with ATen's vector exp (SLEEF, within 1 ulp) on whole vectors and
// std::exp on the rest (on a CPU without AVX2, std::exp on all).
void exp_floats(const float* x, float* o, int64_t n);

// The widest vector units of this CPU the native kernels use: AVX-512 F, AVX2 with FMA, or neither.
enum class CpuIsa : uint8_t { Plain, Avx2, Avx512 };
CpuIsa cpu_isa();

// A symbol of the already-loaded libtorch_cpu (MKL's functions where torch links MKL: vmsTanh here, the packed
// GEMM of conv.cpp), or nullptr.
void* torch_cpu_symbol(const char* name);

}  // namespace etlab_native
