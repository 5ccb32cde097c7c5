// The decode tiles that live in translation units of their own, launched by decode_fp8.cu and
// decode_bf16.cu: the narrow tiles (decode_fp8_narrow.cu, decode_bf16_narrow.cu: CTAs of up to 16
// query rows computed as S^T / O^T, for h * s_q <= 16) and decode_fp8's three-consumer 64-row tile
// (decode_fp8_trio.cu). Which tile a call uses: decode_fp8.cu's Fp8Tile (core/validate.hpp's
// fp8_tile_of_call); decode_bf16.cu's Bf16Tile (launch.hpp, bf16_narrow_tile).
#pragma once

#include <cuda.h>

#include "core/validate.hpp"
#include "params.hpp"
#include "snapmla/formats.hpp"

namespace snapmla::cuda {

inline constexpr int kNarrowTileRows = snapmla::detail::kNarrowRows;  // core/validate.hpp: the P' scale rule reads it too

// The narrow kernel (its consumers' indices as `role` says) plus the combine of split sequences
// (p.rows <= kNarrowTileRows).
void launch_decode_fp8_narrow(RoleIndex role, const DecodeParams& p, const CUtensorMap& tm_latent, const CUtensorMap& tm_rope,
                              const DecodeOptions& options);

// decode_bf16's narrow kernel plus the combine of split sequences (p.rows <= kNarrowTileRows).
void launch_decode_bf16_narrow(const DecodeParams& p, const CUtensorMap& tm_kv, const DecodeOptions& options);

// decode_fp8's three-consumer 64-row kernel (Fp8Tile::kRows64Trio) with the score step `step` (a
// lab option, SNAPMLA_SCORE_STEP) plus the combine of split sequences; tm_q, tm_q_rope: the query
// latent's and rope's planes, as decode_fp8.cu's 64-row tiles read them.
void launch_decode_fp8_trio(ScoreStep step, const DecodeParams& p, const DecodeOptions& options,
                            const CUtensorMap& tm_latent, const CUtensorMap& tm_rope, const CUtensorMap& tm_q,
                            const CUtensorMap& tm_q_rope);

}  // namespace snapmla::cuda
