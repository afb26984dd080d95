// Native int8 kernels for XNNPACK's quantized graphs on the host (qconv.cpp): convolutions, depthwise
// convolutions, fully connected layers and adds on uint8-shifted activations (an int8 value q is held as
// q + 128, the form etlab's XNNPACK backend keeps quantized values in), weights packed once at load.
#pragma once

#include <torch/csrc/utils/pybind.h>

namespace etlab_native {

// Registers Int8Gemm-based classes (QConv2d, QDepthwiseConv2d, QFullyConnected), QAdd and int8_isa on `m`.
void bind_int8_kernels(pybind11::module_& m);

}  // namespace etlab_native
