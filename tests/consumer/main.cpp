// A downstream project: append two tokens to an FP8 cache and decode one query on the CPU.
#include <snapmla/snapmla.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  using namespace snapmla;
  std::vector<e4m3> latent(kPageSize * kLatentDim);
  std::vector<float> scale(kPageSize);
  std::vector<bf16> rope(kPageSize * kRopeDim);
  PagedFp8Cache cache{latent.data(), scale.data(), rope.data(), 1, Device::cpu()};
  std::vector<bf16> kv(2 * kHeadDim);
  for (int i = 0; i < 2 * kHeadDim; ++i) kv[i] = to_bf16(std::sin(0.1f * i));
  std::vector<int32_t> slots = {0, 1};
  append(cache, {kv.data(), 2, Device::cpu()}, {slots.data(), 2, Device::cpu()});
  std::vector<bf16> q(16 * kHeadDim);
  for (int i = 0; i < 16 * kHeadDim; ++i) q[i] = to_bf16(std::cos(0.05f * i));
  std::vector<e4m3> qn(16 * kLatentDim);
  std::vector<bf16> qr(16 * kRopeDim);
  std::vector<float> qs(16);
  QuantizedQuery qq{qn.data(), qr.data(), qs.data(), 1, 1, 16, Device::cpu()};
  quantize_query({q.data(), 1, 1, 16, Device::cpu()}, qq);
  std::vector<int32_t> table = {0}, seqlens = {2};
  std::vector<bf16> out(16 * kLatentDim);
  std::vector<float> lse(16);
  DecodeOptions opt;
  opt.softmax_scale = 0.1f;
  decode_fp8(qq, cache, {table.data(), seqlens.data(), 1, 1, Device::cpu()},
             {out.data(), lse.data(), Device::cpu()}, opt);
  std::printf("consumer: lse[0] = %f\n", lse[0]);
  return std::isfinite(lse[0]) ? 0 : 1;
}
