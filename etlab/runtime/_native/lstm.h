// A decomposed LSTM cell (Edge's twelve steps per time step) run as one native step; see lstm.cpp.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace etlab_native {

// The tensors of one cell, captured at load (they keep their identity for the life of the method):
//   gates = bias + h . w + x          (addmm.out or mm.out, then add.out: B rows of 4H)
//   i, f, g, o = split(gates, H)      (split_with_sizes_copy.out along the last dimension)
//   c_out = sigmoid(f) * c + sigmoid(i) * tanh(g)
//   h_out = sigmoid(o) * tanh(c_out)
// w is (K, 4H) with rows contiguous (the transposed weight Edge wrote out) or columns contiguous; the other
// tensors are dense float32 with B x (their width) elements in row-major order.
struct LstmCell {
  std::optional<at::Tensor> bias;
  at::Tensor h, w, x, c, c_out, h_out;
  int64_t rows = 0, k = 0, hidden = 0;  // B, K, H
  int64_t span = 0;                     // instructions the cell stands for
  std::vector<float> gates;             // B x 4H scratch
};

// The cell of these tensors, checked against the shapes above (std::invalid_argument naming what is wrong; a CPU
// without AVX2 is refused too: the decomposed steps then run).
LstmCell make_lstm_cell(std::optional<at::Tensor> bias, at::Tensor h, at::Tensor w, at::Tensor x, at::Tensor c,
                        at::Tensor c_out, at::Tensor h_out, int64_t span);

// Computes the cell's c_out and h_out; false (nothing written) when a tensor no longer has the sizes, strides,
// dtype or placement seen at load, or the product is one ATen would split over threads: the caller then runs
// the decomposed steps.
bool run_lstm_cell(LstmCell& cell);

}  // namespace etlab_native
