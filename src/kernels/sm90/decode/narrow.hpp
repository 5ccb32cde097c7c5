// decode_fp8's narrow tile (decode_fp8_narrow.cu): CTAs of up to 32 query rows (16 per consumer
// warpgroup) computed as S^T / O^T. Which tile a call uses: decode_fp8.cu's `use_narrow_tile`.
#pragma once

#include <cuda.h>

#include "params.hpp"
#include "snapmla/formats.hpp"

namespace snapmla::cuda {

inline constexpr int kNarrowTileRows = 16;                    // rows per consumer (the wgmma N)
inline constexpr int kNarrowMaxRows = 2 * kNarrowTileRows;    // rows per CTA

// The narrow kernel plus the combine of split sequences (p.rows <= kNarrowMaxRows).
void launch_decode_fp8_narrow(const DecodeParams& p, const CUtensorMap& tm_latent, const CUtensorMap& tm_rope,
                              const DecodeOptions& options);

}  // namespace snapmla::cuda
