// Internal declarations shared by the packed float kernel sources (conv.cpp and conv_depthwise.cpp): the
// depthwise kernels' arguments and row entry points, which PackedConv2d::run (conv.cpp) dispatches to. The
// kernels are split into two files only to keep each one small; this header is no public interface.
#pragma once

#include "conv.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define ETLAB_CONV_X86 1
#endif

#include <cstdint>

namespace etlab_native {
// hidden, as pybind11 is: these names are internal to the module
namespace conv_detail __attribute__((visibility("hidden"))) {

// ---- depthwise ---------------------------------------------------------------------------------------------

struct DwArgs {
  const float* x;   // [N, H, W, C] contiguous
  const float* w;   // [KH*KW, C]
  const float* b;   // [C] or nullptr
  float* y;         // [N, OH, OW, C]
  int64_t h, w_, c, oh, ow;
  ConvGeometry g;
  float lo, hi;
};

// Output row (n, oy) of a depthwise convolution, every channel, into a.y (conv_depthwise.cpp)
#ifdef ETLAB_CONV_X86
__attribute__((target("avx512f"))) void dw_row_avx512(const DwArgs& a, int64_t n, int64_t oy);
__attribute__((target("avx2,fma"))) void dw_row_avx2(const DwArgs& a, int64_t n, int64_t oy);
#endif
void dw_row_plain(const DwArgs& a, int64_t n, int64_t oy);

}  // namespace conv_detail
}  // namespace etlab_native
