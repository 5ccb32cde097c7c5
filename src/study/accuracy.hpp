// The quantization ablation of the SnapMLA paper, on the CPU: each recipe's decode output
// against exact float64 attention on the unquantized inputs.
#pragma once

#include <string>
#include <vector>

#include "study/synthetic.hpp"

namespace snapmla::accuracy {

enum class Recipe {
  kSnapMla,           // per-token latent scale, rope bf16 pre-scaled; per-(token, head) query
  kRopeFp8,           // (A) per-token scale over all 576 dims, rope in e4m3 too
  kPerTensorStatic,   // (B) scale 1.0 for cache and query, all 576 dims e4m3
  kPerTensorDynamic,  // (C) one scale = amax of the whole cache (and of all queries) / 448
  kPerBlock,          // (D) one latent scale per 64-token block, rope bf16 pre-scaled
  kBf16Cache,         // the BF16 cache and BF16 decode (FlashMLA's arithmetic)
};
inline constexpr Recipe kAllRecipes[] = {Recipe::kSnapMla,          Recipe::kRopeFp8,
                                         Recipe::kPerTensorStatic,  Recipe::kPerTensorDynamic,
                                         Recipe::kPerBlock,         Recipe::kBf16Cache};
std::string name(Recipe r);
std::string description(Recipe r);

struct Metrics {
  double rel_l2 = 0;       // ||o - o*|| / ||o*|| over all rows
  double cosine = 0;       // <o, o*> / (||o|| ||o*||) over all rows
  double max_lse_err = 0;  // max |lse - lse*| over rows that see tokens
};

// Truth for one sequence: float64 attention on the fp32 inputs.
struct Truth {
  std::vector<double> out;  // [s_q, h, 512]
  std::vector<double> lse;  // [h, s_q]
  // Mean over rows of exp(entropy of the attention distribution): an "effective number of
  // attended tokens", to show how peaked the data's attention is.
  double effective_tokens = 0;
};
Truth ground_truth(const synthetic::Sequence& seq);

// Runs one recipe end to end (quantize the cache and the queries, decode, bf16 output): SnapMLA
// and BF16 through the public API on a paged cache with shuffled pages; the other recipes
// through the same FP8 attention arithmetic with their own scales.
Metrics evaluate(Recipe recipe, const synthetic::Sequence& seq, const Truth& truth);

}  // namespace snapmla::accuracy
