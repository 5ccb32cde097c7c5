// A model of the V^T-register tile's synchronization (decode_fp8.cu, decode_fp8_vregs_kernel), run
// on the CPU: one thread per warp walks the kernel's control flow over a worker's splits, with
// named barriers (bar.sync / bar.arrive counted in threads), the page ring's mbarriers (phases and
// parities) and the shared slots (page stages, running max, P', factors) tagged with the (split,
// page) that wrote them. Every read checks that it sees the tag it needs, so a missing or
// misnumbered barrier shows up as a stale or overwritten slot or as a deadlock (a watchdog), under
// random delays. It checks the protocol, not the arithmetic or the memory model (the state is
// sequentially consistent: the kernel's proxy fences are not modelled). Barrier ids and counts are
// the kernel's (Fp8Barrier, kSplitBoundaryBarrier).
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr int kStages = 4, kWarpThreads = 32;
enum Id { kAddSums = 1, kMax = 2, kP = 4, kFree = 6, kRowTotals = 10, kOwnRows = 11, kBoundary = 15 };

struct Tag {
  int split = -1, page = -1;
  bool operator==(const Tag& o) const { return split == o.split && page == o.page; }
};

class Model {
 public:
  explicit Model(std::vector<int> pages) : pages_(std::move(pages)) {}

  // Runs the CTA's 12 warps; returns the first violation ("" if none).
  std::string run(unsigned seed) {
    init_ring();
    std::vector<std::thread> warps;
    for (int w = 0; w < 12; ++w) warps.emplace_back([this, w, seed] { warp(w, seed * 131 + unsigned(w)); });
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (done_ < 12 && std::chrono::steady_clock::now() < deadline && error().empty())
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (done_ < 12 && error().empty()) fail("deadlock");
    abort_ = true;
    cv_.notify_all();
    for (auto& t : warps) t.join();
    return error();
  }

 private:
  struct Named {
    int expected = 0, arrived = 0;
    long gen = 0;
  };
  struct MBar {
    int count = 0, pending = 0;
    long completed = 0;
  };

  std::string error() {
    std::lock_guard<std::mutex> g(m_);
    return error_;
  }
  void fail(const std::string& e) {
    std::lock_guard<std::mutex> g(m_);
    if (error_.empty()) error_ = e;
    abort_ = true;
    cv_.notify_all();
  }
  void jitter(std::mt19937& rng) {
    if (rng() % 4 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 50));
  }
  // bar.sync (wait) / bar.arrive (no wait) of one warp on barrier `id` expecting `n` threads.
  void bar(int id, int n, bool wait) {
    std::unique_lock<std::mutex> l(m_);
    Named& b = named_[id];
    if (b.arrived == 0) b.expected = n;
    if (b.expected != n) {
      error_ = "barrier " + std::to_string(id) + " used with counts " + std::to_string(b.expected) + " and " +
               std::to_string(n);
      abort_ = true;
      cv_.notify_all();
      return;
    }
    const long gen = b.gen;
    b.arrived += kWarpThreads;
    if (b.arrived == n) {
      b.arrived = 0;
      ++b.gen;
      cv_.notify_all();
      return;
    }
    if (wait) cv_.wait(l, [&] { return abort_ || b.gen != gen; });
  }
  void mbar_arrive(MBar& b, int threads) {
    std::lock_guard<std::mutex> g(m_);
    b.pending -= threads;
    if (b.pending < 0) error_ = "mbarrier over-arrived", abort_ = true;
    if (b.pending == 0) {
      ++b.completed;
      b.pending = b.count;
      cv_.notify_all();
    }
  }
  void mbar_wait(MBar& b, int parity) {
    std::unique_lock<std::mutex> l(m_);
    cv_.wait(l, [&] { return abort_ || int(b.completed % 2) != parity; });
  }
  void init_ring() {
    for (auto& f : full_) f = {kWarpThreads, kWarpThreads, 0};  // the loader's arrival (with the bytes)
    for (auto& e : empty_) e = {256, 256, 0};                   // every consumer thread
    qbar_ = {2 * kWarpThreads, 2 * kWarpThreads, 0};             // two TMA arrivals
  }
  Tag get(const Tag& slot) {
    std::lock_guard<std::mutex> g(m_);
    return slot;
  }
  void put(Tag& slot, Tag v) {
    std::lock_guard<std::mutex> g(m_);
    slot = v;
  }
  void expect(const Tag& slot, Tag want, const char* what) {
    const Tag got = get(slot);
    if (!(got == want))
      fail(std::string(what) + ": want split " + std::to_string(want.split) + " page " + std::to_string(want.page) +
           ", saw split " + std::to_string(got.split) + " page " + std::to_string(got.page));
  }
  void boundary(bool init) {
    bar(kBoundary, 384, true);
    if (init) {
      std::lock_guard<std::mutex> g(m_);
      init_ring_locked();
    }
    bar(kBoundary, 384, true);
  }
  void init_ring_locked() {
    for (auto& f : full_) f = {kWarpThreads, kWarpThreads, 0};
    for (auto& e : empty_) e = {256, 256, 0};
    qbar_ = {2 * kWarpThreads, 2 * kWarpThreads, 0};
  }

  void warp(int w, unsigned seed) {
    std::mt19937 rng(seed);
    const int splits = int(pages_.size());
    if (w == 0) {  // the producer's warp 0 (thread 0 loads)
      for (int item = 0; item < splits && !abort_; ++item) {
        if (item > 0) boundary(true);
        mbar_arrive(qbar_, kWarpThreads);
        mbar_arrive(qbar_, kWarpThreads);
        for (int j = 0; j < pages_[item] && !abort_; ++j) {
          if (j >= kStages) mbar_wait(empty_[j % kStages], ((j / kStages) & 1) ^ 1);
          jitter(rng);
          put(stage_[j % kStages], {item, j});
          mbar_arrive(full_[j % kStages], kWarpThreads);
        }
      }
    } else if (w < 4) {
      for (int item = 1; item < splits && !abort_; ++item) boundary(false);
    } else {
      consumer((w - 4) / 4, (w - 4) % 4, rng);
    }
    ++done_;
  }

  void consumer(int c, int wq, std::mt19937& rng) {
    const int splits = int(pages_.size());
    for (int item = 0; item < splits && !abort_; ++item) {
      if (item > 0) boundary(false);
      const int nblk = pages_[item];
      mbar_wait(qbar_, 0);
      auto ring_wait = [&](int j) { mbar_wait(full_[j % kStages], (j / kStages) & 1); };
      auto score = [&](int j) {
        ring_wait(j);
        expect(stage_[j % kStages], {item, j}, "QK reads its page's stage");
      };
      auto pv = [&](int jj) {
        ring_wait(jj);
        expect(stage_[jj % kStages], {item, jj}, "PV reads its page's V");
        for (int x = 0; x < 4; ++x) {
          expect(factors_[jj % 2][x], {item, jj}, "PV reads its page's factors");
          expect(p_[jj % 2][x], {item, jj}, "PV reads its page's P'");
        }
      };
      const int jlast = nblk > 0 ? nblk : -1;
      if (nblk > 0) score(std::min(c, nblk - 1));
      for (int j = c; j <= jlast && !abort_; j += 2) {
        const bool mine = j < nblk;
        jitter(rng);
        if (mine) {  // softmax_page
          expect(stage_[j % kStages], {item, j}, "softmax reads its page's scales");
          if (j > 0) {
            bar(kMax + 1 - c, 256, true);
            for (int x = 0; x < 4; ++x) expect(max_[(j - 1) % 2][x], {item, j - 1}, "running max of the page before");
          }
          put(max_[j % 2][wq], {item, j});
          if (j + 1 < nblk) bar(kMax + c, 256, false);
          if (j >= 2) bar(kFree + c, 256, true);
          jitter(rng);
          put(p_[j % 2][wq], {item, j});
        }
        if (j > 0) {
          bar(kP + 1 - c, 256, true);
          for (int x = 0; x < 4; ++x) expect(factors_[(j - 1) % 2][x], {item, j - 1}, "factors of the page before");
        }
        if (mine) {
          put(factors_[j % 2][wq], {item, j});
          bar(kP + c, 256, false);
          bar(kOwnRows + c, 128, true);
        }
        if (j > 0) {
          pv(j - 1);
          jitter(rng);
          mbar_arrive(empty_[(j - 1) % kStages], kWarpThreads);
          if (j + 1 < nblk) bar(kFree + 1 - c, 256, false);
        }
        if (mine) pv(j);
        score(std::min(j + 2, nblk - 1));
        if (mine) mbar_arrive(empty_[j % kStages], kWarpThreads);
      }
      bar(kAddSums, 256, true);
      bar(kRowTotals, 256, true);
    }
  }

  std::vector<int> pages_;  // pages of each split of the worker
  std::mutex m_;
  std::condition_variable cv_;
  std::atomic<bool> abort_{false};
  std::atomic<int> done_{0};
  std::string error_;
  std::array<Named, 16> named_{};
  std::array<MBar, kStages> full_{}, empty_{};
  MBar qbar_{};
  std::array<Tag, kStages> stage_{};
  Tag max_[2][4], p_[2][4], factors_[2][4];
};

TEST(VRegsSyncModel, EveryReadSeesItsPageAndNothingDeadlocks) {
  const std::vector<std::vector<int>> workers = {{0}, {1}, {2}, {3}, {5}, {8}, {9}, {1, 1}, {3, 0, 4},
                                                 {7, 2, 1, 6}, {0, 0}, {16, 1}};
  for (const auto& w : workers)
    for (unsigned seed = 1; seed <= 3; ++seed) {
      Model m(w);
      std::string pages;
      for (int n : w) pages += std::to_string(n) + " ";
      EXPECT_EQ(m.run(seed), "") << "splits of " << pages << "pages, seed " << seed;
    }
}

}  // namespace
