// The two vector forms of conv_simd_kernels.h, avx512:: and avx2::, each compiled inside its instruction set's
// target region. Included inside namespace conv_detail by each file that calls them (conv.cpp,
// conv_depthwise.cpp); no include guard for the same reason as conv_simd_kernels.h.
ETLAB_TARGET_BEGIN("avx512f")
namespace avx512 {
#include "conv_simd_kernels.h"
}  // namespace avx512
ETLAB_TARGET_END

ETLAB_TARGET_BEGIN("avx2,fma")
namespace avx2 {
#include "conv_simd_kernels.h"
}  // namespace avx2
ETLAB_TARGET_END
