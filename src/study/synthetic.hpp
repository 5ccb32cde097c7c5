// Seeded synthetic MLA decode inputs. Real model weights cannot be fetched here, so accuracy
// numbers use data shaped like real MLA caches (docs/accuracy.md describes the construction):
//   kMlaLike  - latent with per-channel gains and a few outlier channels, per-token norm
//               variation and a large-norm "sink" token at position 0; rope keys with per-pair
//               magnitudes up to about 1e3, rotated by position; queries from the same family
//               (gains, rope pairs matched to the key pairs) that attend to a few target tokens
//               and the sink, so attention is peaked; a quarter of the heads are diffuse.
//   kGaussian - everything N(0, 1), softmax_scale = 1/sqrt(576): the peers' test data.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace snapmla::synthetic {

enum class DataKind { kMlaLike, kGaussian };
std::string to_string(DataKind k);

struct Config {
  DataKind kind = DataKind::kMlaLike;
  uint64_t seed = 0;
  int seqlen_k = 1024;  // tokens in the cache (the queries are its last seqlen_q positions)
  int seqlen_q = 1;
  int num_heads = 128;
};

// One sequence of unquantized (fp32) inputs.
struct Sequence {
  Config config;
  std::vector<float> kv;  // [seqlen_k, 576]: latent c_t (512), rope key k_t (64)
  std::vector<float> q;   // [seqlen_q, num_heads, 576]: absorbed nope (512), rope (64)
  float softmax_scale = 0.0f;
};

Sequence make_sequence(const Config& config);

}  // namespace snapmla::synthetic
