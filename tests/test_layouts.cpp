// The V^T-register tile's register layouts (src/kernels/sm90/decode/vregs_layout.hpp) against
// a model of the instructions that use them, on the CPU: the page's latent as TMA writes it
// (128-byte swizzle), ldmatrix.trans with the kernel's lane addresses, the kernel's byte
// permutes, and the wgmma fragment layouts from the PTX ISA. A wrong index in the header makes
// the GPU result wrong in ways the decode tests only see as an error; here it names the element.
// And the three-consumer tile's page bookkeeping (trio_schedule.hpp), which a wrong offset would
// turn into a hang on the GPU.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <set>

#include "kernels/sm90/decode/trio_schedule.hpp"
#include "kernels/sm90/decode/vregs_layout.hpp"

namespace {

using namespace snapmla::cuda::vregs;

// A byte of the page's latent: which token and dim it holds.
struct Elem {
  int token = -1, dim = -1;
  bool operator==(const Elem& o) const { return token == o.token && dim == o.dim; }
};

constexpr int kBox = 64 * 128;  // one TMA box: 64 tokens x 128 bytes

// The latent tile as TMA writes it with the 128-byte swizzle: byte `x` of token t's row in box b
// sits at 16-byte chunk (x / 16) ^ (t % 8).
Elem latent_at(int addr) {
  const int box = addr / kBox, t = (addr % kBox) / 128, pchunk = (addr % 128) / 16, byte = addr % 16;
  const int chunk = pchunk ^ (t % 8);
  return {t, box * 128 + chunk * 16 + byte};
}

// ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 with lane l addressing row l % 8 of matrix l / 8:
// thread (g = l / 4, q = l % 4) gets in register m the b16 elements (row 2q, col g) and
// (row 2q + 1, col g) of matrix m, i.e. bytes 2g, 2g + 1 of the rows addressed by lanes
// 8m + 2q and 8m + 2q + 1.
std::array<std::array<Elem, 4>, 4> ldmatrix_x4_trans(const std::array<int, 32>& row_addr, int lane) {
  const int g = lane / 4, q = lane % 4;
  std::array<std::array<Elem, 4>, 4> v{};
  for (int m = 0; m < 4; ++m)
    for (int half = 0; half < 2; ++half) {
      const int row = row_addr[8 * m + 2 * q + half];
      v[m][2 * half] = latent_at(row + 2 * g);
      v[m][2 * half + 1] = latent_at(row + 2 * g + 1);
    }
  return v;
}

// prmt.b32 d, a, b, sel (default mode): byte i of d is byte sel[i] of the pair {b, a}.
std::array<Elem, 4> prmt(const std::array<Elem, 4>& a, const std::array<Elem, 4>& b, uint32_t sel) {
  std::array<Elem, 4> d{};
  for (int i = 0; i < 4; ++i) {
    const int s = int((sel >> (4 * i)) & 7u);
    d[i] = s < 4 ? a[s] : b[s - 4];
  }
  return d;
}

// The kernel's load_vt for one (consumer, M tile, K step, warp, lane): its four A registers.
std::array<std::array<Elem, 4>, 4> load_vt_model(int c, int mt, int ks, int w, int lane) {
  std::array<int, 32> addr{};
  for (int l = 0; l < 32; ++l) {
    const int t = lane_token(ks, l);
    addr[l] = vt_box(c, mt) * kBox + t * 128 + vt_chunk(mt, w, t) * 16;
  }
  const auto v = ldmatrix_x4_trans(addr, lane);
  return {prmt(v[0], v[1], 0x6420u), prmt(v[0], v[1], 0x7531u), prmt(v[2], v[3], 0x6420u),
          prmt(v[2], v[3], 0x7531u)};
}

TEST(VRegsLayout, SlotOrderIsAPermutationOfEachKStep) {
  for (int ks = 0; ks < 2; ++ks) {
    std::set<int> seen;
    for (int k = 0; k < 32; ++k) seen.insert(slot_token(32 * ks + k));
    EXPECT_EQ(seen.size(), 32u);
    EXPECT_EQ(*seen.begin(), 32 * ks);
    EXPECT_EQ(*seen.rbegin(), 32 * ks + 31);
  }
}

// wgmma's 8-bit A fragment from registers (m64 x k32): thread (warp w, g, q) holds in register i
// the four bytes of M row 16 w + g + 8 (i % 2), K 16 (i / 2) + 4 q .. + 3. Each must be V^T at
// that row's dim and that slot's token.
TEST(VRegsLayout, LoadedFragmentsAreVTransposedInSlotOrder) {
  for (int c = 0; c < 2; ++c)
    for (int mt = 0; mt < 4; ++mt)
      for (int ks = 0; ks < 2; ++ks)
        for (int w = 0; w < 4; ++w)
          for (int lane = 0; lane < 32; ++lane) {
            const auto a = load_vt_model(c, mt, ks, w, lane);
            const int g = lane / 4, q = lane % 4;
            for (int i = 0; i < 4; ++i)
              for (int b = 0; b < 4; ++b) {
                const int row = 16 * w + g + 8 * (i % 2), k = 16 * (i / 2) + 4 * q + b;
                const Elem want{slot_token(32 * ks + k), row_dim(c, mt, row)};
                ASSERT_EQ(a[i][b], want) << "c " << c << " mt " << mt << " ks " << ks << " warp " << w << " lane "
                                         << lane << " reg " << i << " byte " << b << ": got token "
                                         << a[i][b].token << " dim " << a[i][b].dim;
              }
          }
}

// The softmax stores P' (S fragment: thread q holds tokens 8 n + 2 q + {0, 1}) as one word per
// row at slots 16 hh + 4 q .. + 3, tokens of n-tiles 2 hh and 2 hh + 1: the slot order's tokens.
TEST(VRegsLayout, SoftmaxWordsHoldTheSlotsTokens) {
  for (int hh = 0; hh < 4; ++hh)
    for (int q = 0; q < 4; ++q)
      for (int b = 0; b < 4; ++b) {
        const int n = 2 * hh + b / 2, token = 8 * n + 2 * q + b % 2;
        EXPECT_EQ(slot_token(16 * hh + 4 * q + b), token) << "hh " << hh << " q " << q << " byte " << b;
      }
}

// The output: accumulator row r (dim row_dim) and row r + 8 hold neighbouring dims (one bf16 pair
// per store), every dim is one consumer's once, and write_columns' base + M-tile offset is the dim.
TEST(VRegsLayout, AccumulatorRowsCoverEveryDimOnce) {
  std::set<int> dims;
  for (int c = 0; c < 2; ++c)
    for (int mt = 0; mt < 4; ++mt)
      for (int row = 0; row < 64; ++row) {
        const int d = row_dim(c, mt, row);
        EXPECT_TRUE(dims.insert(d).second) << "dim " << d << " twice";
        if (row % 16 < 8) {
          EXPECT_EQ(row_dim(c, mt, row + 8), d + 1);
        }
        EXPECT_EQ(d, row_dim(c, 0, row) + row_dim(0, mt, 0));
      }
  EXPECT_EQ(dims.size(), 512u);
  EXPECT_EQ(*dims.rbegin(), 511);
}

// The three-consumer tile's page bookkeeping (trio_schedule.hpp) against the direct forms, page
// mod 3 and page / 3, over every consumer, the first hundred iterations and each page the
// iteration touches.
TEST(TrioSchedule, SlotsPhasesAndTakersAreTheDirectForms) {
  using namespace snapmla::cuda::trio;
  for (int c = 0; c < 3; ++c)
    for (int k = 0; k < 100; ++k)
      for (int d = -2; d <= 1; ++d) {
        const int page = 3 * k + c + d;
        if (page < 0) continue;
        const PageSlot s = page_slot(c, k, d);
        EXPECT_EQ(s.slot, page % 3) << "c " << c << " k " << k << " d " << d;
        EXPECT_EQ(s.parity, (page / 3) & 1) << "c " << c << " k " << k << " d " << d;
        if (d <= 0) {
          EXPECT_EQ(slot_taker(c, d), (page + 2) % 3) << "c " << c << " d " << d;
        }
      }
  for (int x = -3; x < 6; ++x) {
    EXPECT_EQ(mod3(x), ((x % 3) + 3) % 3) << x;
    EXPECT_EQ(floor_div3(x), x < 0 ? -1 : x / 3) << x;
  }
}

}  // namespace
