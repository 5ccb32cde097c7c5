// Models of the decode kernels' synchronization, run on the CPU: one thread per warp walks the
// kernel's control flow over a worker's splits, with named barriers (bar.sync / bar.arrive counted
// in threads), mbarriers (phases and parities) and the shared slots (page stages, running max, P',
// factors) tagged with the (split, page) that wrote them. Every read checks that it sees the tag it
// needs, so a missing or misnumbered barrier shows up as a stale or overwritten slot or as a
// deadlock (a watchdog), under random delays; a wgmma's reads are checked where it is issued and
// again where its warp waits for it. They check the protocol, not the arithmetic or the memory
// model (the state is sequentially consistent: the kernels' proxy fences are not modelled).
// Barrier ids and counts are the kernels' (Fp8Barrier, Fp8TrioBarrier, Bf16Barrier,
// kSplitBoundaryBarrier). The models: decode_fp8's transposing 64-row tile (decode_fp8_kernel,
// per-page P' scales), its V^T-register tile (decode_fp8_vregs_kernel) and its three-consumer tile
// (decode_fp8_trio_kernel), decode_bf16 (decode_bf16.cu) under both orders of its next QKs
// (Bf16QkOrder) and with the early max hand-off (Bf16MaxHandOff), and decode_bf16's narrow tile (decode_bf16_narrow.cu).
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

constexpr int kWarpThreads = 32, kBoundary = 15;

struct Tag {
  int split = -1, page = -1;
  bool operator==(const Tag& o) const { return split == o.split && page == o.page; }
};

// A split of the BF16 models' workers: its pages, and whether its last page ends inside it (the
// kernels then zero that page's tokens past the split end in its stage).
struct PagesOfSplit {
  int pages;
  bool partial_last;
};

// The primitives the models share, and their run: a CTA of warps() warps (12 unless the model
// says otherwise: 384 threads), each model giving its barriers' initial state (reset) and what
// warp w does (warp).
class Sim {
 public:
  virtual ~Sim() = default;
  // Runs the CTA's warps, warp w with its own random delays; returns the first violation ("" if none).
  std::string run(unsigned seed) {
    const int warps = this->warps();
    reset();
    std::vector<std::thread> threads;
    for (int w = 0; w < warps; ++w)
      threads.emplace_back([this, w, seed] {
        std::mt19937 rng(seed * 131 + unsigned(w));
        warp(w, rng);
        ++done_;
      });
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (done_ < warps && std::chrono::steady_clock::now() < deadline && error().empty())
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (done_ < warps && error().empty()) fail("deadlock");
    abort_ = true;
    cv_.notify_all();
    for (auto& t : threads) t.join();
    return error();
  }

 protected:
  virtual void reset() = 0;  // the mbarriers as thread 0 initializes them (at the start and each boundary)
  virtual void warp(int w, std::mt19937& rng) = 0;
  virtual int warps() const { return 12; }

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
  // The split boundary (scheduler.cuh, split_boundary) of the whole CTA; `init`: the thread that
  // re-initializes the barriers (reset, under the lock).
  void boundary(bool init) {
    bar(kBoundary, kWarpThreads * warps(), true);
    if (init) {
      std::lock_guard<std::mutex> g(m_);
      reset();
    }
    bar(kBoundary, kWarpThreads * warps(), true);
  }

  std::mutex m_;
  std::condition_variable cv_;
  std::atomic<bool> abort_{false};
  std::atomic<int> done_{0};
  std::string error_;
  std::array<Named, 16> named_{};
};

// The V^T-register tile (decode_fp8_vregs_kernel): a producer warpgroup (warp 0 loads) and two
// consumers on a four-stage page ring.
class VRegsModel : public Sim {
 public:
  explicit VRegsModel(std::vector<int> pages) : pages_(std::move(pages)) {}

 private:
  static constexpr int kStages = 4;
  enum Id { kAddSums = 1, kMax = 2, kP = 4, kFree = 6, kRowTotals = 10, kOwnRows = 11 };

  void reset() override {
    for (auto& f : full_) f = {kWarpThreads, kWarpThreads, 0};  // the loader's arrival (with the bytes)
    for (auto& e : empty_) e = {256, 256, 0};                   // every consumer thread
    qbar_ = {2 * kWarpThreads, 2 * kWarpThreads, 0};             // two TMA arrivals
  }
  void warp(int w, std::mt19937& rng) override {
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
  std::array<MBar, kStages> full_{}, empty_{};
  MBar qbar_{};
  std::array<Tag, kStages> stage_{};
  Tag max_[2][4], p_[2][4], factors_[2][4];
};

// The transposing 64-row tiles' producer warpgroup and CTA: warp 0 loads the Q tiles (kQArrivals
// TMA arrivals) and the pages into a kStages ring, warps 1-3 transpose each page's latent into one
// of kVtSlots V^T slots (behind barrier kTransposerBar on masked pages), and the consumer warps
// (kConsumers warpgroups of four warps) run the derived model's consume().
template <int kStages, int kVtSlots, int kConsumers, int kQArrivals, int kTransposerBar>
class TransposingTileModel : public Sim {
 public:
  explicit TransposingTileModel(std::vector<int> pages) : pages_(std::move(pages)) {}

 protected:
  virtual void consume(int item, int c, int wq, std::mt19937& rng) = 0;

  int warps() const override { return 4 * (1 + kConsumers); }
  void reset() override {
    for (auto& f : full_) f = {kWarpThreads, kWarpThreads, 0};  // the loader's arrival (with the bytes)
    for (auto& e : empty_) e = {224, 224, 0};                    // the owner's 128 threads and the 96 transposers
    for (auto& f : vt_full_) f = {96, 96, 0};
    for (auto& e : vt_empty_) e = {128 * kConsumers, 128 * kConsumers, 0};  // every consumer thread
    qbar_ = {kQArrivals * kWarpThreads, kQArrivals * kWarpThreads, 0};
  }
  void ring_wait(int j) { mbar_wait(full_[j % kStages], (j / kStages) & 1); }

  void warp(int w, std::mt19937& rng) override {
    const int splits = int(pages_.size());
    for (int item = 0; item < splits && !abort_; ++item) {
      if (item > 0) boundary(w == 0);
      if (w == 0) load(item, rng);
      else if (w < 4) transpose(item, rng);
      else consume(item, (w - 4) / 4, (w - 4) % 4, rng);
    }
  }

  void load(int item, std::mt19937& rng) {
    put(q_, {item, -1});
    for (int a = 0; a < kQArrivals; ++a) mbar_arrive(qbar_, kWarpThreads);
    for (int j = 0; j < pages_[item] && !abort_; ++j) {
      if (j >= kStages) mbar_wait(empty_[j % kStages], ((j / kStages) & 1) ^ 1);
      jitter(rng);
      put(stage_[j % kStages], {item, j});
      mbar_arrive(full_[j % kStages], kWarpThreads);
    }
  }

  void transpose(int item, std::mt19937& rng) {
    for (int i = 0; i < pages_[item] && !abort_; ++i) {
      ring_wait(i);
      if (i >= kVtSlots) mbar_wait(vt_empty_[i % kVtSlots], ((i / kVtSlots) - 1) & 1);
      expect(stage_[i % kStages], {item, i}, "the transposers read their page's latent");
      jitter(rng);
      put(vt_[i % kVtSlots], {item, i});
      // zero_nan_tokens' barrier of the three warps, taken on masked pages: every third page here.
      if (i % 3 == 0) bar(kTransposerBar, 96, true);
      mbar_arrive(vt_full_[i % kVtSlots], kWarpThreads);
      mbar_arrive(empty_[i % kStages], kWarpThreads);
    }
  }

  std::vector<int> pages_;
  std::array<MBar, kStages> full_{}, empty_{};
  std::array<MBar, kVtSlots> vt_full_{}, vt_empty_{};
  MBar qbar_{};
  Tag q_, stage_[kStages], vt_[kVtSlots];
};

// decode_fp8's transposing 64-row tile (decode_fp8_kernel under the per-page P' scales): a producer
// warpgroup (warp 0 loads, warps 1-3 transpose each page's latent into a V^T slot) and two
// consumers in ping-pong on a three-stage page ring: consumer c owns pages j = c (mod 2) (QK,
// softmax, P'), hands the running max over (kMax + c) and the page's P' and factors (kP + c), and
// takes the PV of every page for its output half; a P' buffer is taken again once the other
// consumer's PV of the page before has left it (kFree + c).
class Fp8TileModel : public TransposingTileModel<3, 2, 2, 1, 9> {
 public:
  using TransposingTileModel::TransposingTileModel;

 private:
  static constexpr int kStages = 3;
  enum Id { kAddSums = 1, kMax = 2, kP = 4, kFree = 6, kOwnPage = 10 };

  void consume(int item, int c, int wq, std::mt19937& rng) override {
    const int nblk = pages_[item];
    mbar_wait(qbar_, 0);
    auto score = [&](int j) {
      ring_wait(j);
      expect(stage_[j % kStages], {item, j}, "QK reads its page");
      expect(q_, {item, -1}, "QK reads its split's Q");
    };
    auto pv = [&](int jj) {
      mbar_wait(vt_full_[jj % 2], (jj / 2) & 1);
      expect(vt_[jj % 2], {item, jj}, "PV reads its page's V^T");
      for (const Tag& quarter : p_[jj % 2]) expect(quarter, {item, jj}, "PV reads its page's P'");
    };
    // A wgmma reads its operands until it completes: the reads are checked again where the
    // warp waits for it (wg::wait), so a buffer taken again before then shows.
    auto pv_done = [&](int jj) {
      expect(vt_[jj % 2], {item, jj}, "PV reads its page's V^T until it completes");
      for (const Tag& quarter : p_[jj % 2]) expect(quarter, {item, jj}, "PV reads its page's P' until it completes");
    };
    const int jlast = nblk > 0 ? nblk : -1;
    if (nblk > 0) score(std::min(c, nblk - 1));
    for (int j = c; j <= jlast && !abort_; j += 2) {
      const bool mine = j < nblk;
      jitter(rng);
      expect(stage_[std::min(j, nblk - 1) % kStages], {item, std::min(j, nblk - 1)}, "QK reads its page until it completes");
      if (mine) {  // page_factors_early
        expect(stage_[j % kStages], {item, j}, "the softmax reads its page's scales");
        mbar_arrive(empty_[j % kStages], kWarpThreads);
        if (j > 0) {
          bar(kMax + 1 - c, 256, true);
          expect(max_[(j - 1) % 2], {item, j - 1}, "the running max of the page before");
        }
        put(max_[j % 2], {item, j});
        if (j + 1 < nblk) bar(kMax + c, 256, false);
      }
      if (j > 0) {
        bar(kP + 1 - c, 256, true);
        expect(factors_[(j - 1) % 2], {item, j - 1}, "the factors of the page before");
        pv(j - 1);
      }
      if (mine) {  // store_page_p, publish_page
        if (j >= 2) bar(kFree + c, 256, true);
        jitter(rng);
        put(p_[j % 2][wq], {item, j});
        put(factors_[j % 2], {item, j});
        bar(kP + c, 256, false);
      }
      if (j > 0) {
        jitter(rng);
        pv_done(j - 1);
        mbar_arrive(vt_empty_[(j - 1) % 2], kWarpThreads);
        if (j + 1 < nblk) bar(kFree + 1 - c, 256, false);
      }
      if (mine) {
        bar(kOwnPage + c, 128, true);
        pv(j);
      }
      score(std::min(j + 2, nblk - 1));  // past the last page, a repeat of the last one
      if (mine) {
        pv_done(j);
        mbar_arrive(vt_empty_[j % 2], kWarpThreads);
      }
    }
    bar(kAddSums, 256, true);
    if (nblk > 0) expect(max_[(nblk - 1) % 2], {item, nblk - 1}, "the lse's running max");
    // The epilogue stages its rows from the Q tile on (into the page stages after it).
    put(q_, {item, -2});
    for (auto& stage : stage_) put(stage, {item, -2});
  }

  Tag max_[2], factors_[2], p_[2][4];
};

// decode_fp8's three-consumer 64-row tile (decode_fp8_trio_kernel): the transposing tile's producer
// (warp 0 loads, warps 1-3 transpose into three V^T slots) and three consumers on a two-stage page
// ring (16 warps, 512 threads): consumer c owns pages j = c (mod 3), applies page j - 2 (issuing its
// PV under its softmax of page j; after it in the other order, TrioOrder::kSoftmaxFirst), takes the
// running max from page j - 1's owner (kMax + owner, 256 threads), applies page j - 1, writes page j's P' and factors into slot j % 2 once the other
// two consumers' PVs of page j - 2 are done (kFree + c, 384) and publishes them (kP + c, 384), then
// its own PV and the QK of page j + 3. After the pages the consumers sum their parts of l (kAllConsumers)
// and a split with one sequence assembles its rows in the page stages behind the same barrier id.
class TrioModel : public TransposingTileModel<2, 3, 3, 2, 14> {
 public:
  // softmax_first: TrioOrder::kSoftmaxFirst (page j's softmax before page j - 2's PV).
  TrioModel(std::vector<int> pages, bool softmax_first)
      : TransposingTileModel(std::move(pages)), softmax_first_(softmax_first) {}

 private:
  bool softmax_first_;
  static constexpr int kStages = 2, kVtSlots = 3, kSlots = 2, kConsumers = 3, kAll = 384;
  enum Id { kAllConsumers = 1, kMax = 2, kP = 5, kFree = 8, kOwnPage = 11 };

  void consume(int item, int c, int wq, std::mt19937& rng) override {
    const int nblk = pages_[item];
    mbar_wait(qbar_, 0);
    // next_score: where `guard`, page j - 2's V^T first, so that the stage's parity cannot alias
    // page j - 4's (the kernel guards the QK of page j + 3 and consumer 2's first, page 2).
    auto score = [&](int j, bool guard) {
      if (guard) mbar_wait(vt_full_[(j - 2) % kVtSlots], ((j - 2) / kVtSlots) & 1);
      ring_wait(j);
      expect(stage_[j % kStages], {item, j}, "QK reads its page");
      expect(q_, {item, -1}, "QK reads its split's Q");
    };
    auto pv = [&](int jj) {
      mbar_wait(vt_full_[jj % kVtSlots], (jj / kVtSlots) & 1);
      expect(vt_[jj % kVtSlots], {item, jj}, "PV reads its page's V^T");
      for (const Tag& quarter : p_[jj % kSlots]) expect(quarter, {item, jj}, "PV reads its page's P'");
    };
    auto pv_done = [&](int jj) {
      expect(vt_[jj % kVtSlots], {item, jj}, "PV reads its page's V^T until it completes");
      for (const Tag& quarter : p_[jj % kSlots]) expect(quarter, {item, jj}, "PV reads its page's P' until it completes");
    };
    // The other consumers' page jj: its P' and factors (kP + owner), then its PV.
    auto apply = [&](int jj, int owner) {
      bar(kP + owner, kAll, true);
      expect(factors_[jj % kSlots][wq], {item, jj}, "the factors of another consumer's page");
      pv(jj);
    };
    auto retire = [&](int jj) {
      mbar_arrive(vt_empty_[jj % kVtSlots], kWarpThreads);
      const int taker = (jj + 2) % kConsumers;
      if (taker != c && jj + 2 < nblk) bar(kFree + taker, kAll, false);
    };
    const int jlast = nblk > 0 ? nblk + 1 : -1;
    if (nblk > 0) score(std::min(c, nblk - 1), c == 2 && nblk > 2);
    for (int j = c; j <= jlast && !abort_; j += kConsumers) {
      const bool mine = j < nblk, before2 = j >= 2 && j - 2 < nblk, before1 = j >= 1 && j - 1 < nblk;
      const int prev = (c + 2) % kConsumers, prev2 = (c + 1) % kConsumers;
      jitter(rng);
      expect(stage_[std::min(j, nblk - 1) % kStages], {item, std::min(j, nblk - 1)}, "QK reads its page until it completes");
      if (!softmax_first_ && before2) apply(j - 2, prev2);
      if (mine) {  // page_factors_early
        expect(stage_[j % kStages], {item, j}, "the softmax reads its page's scales");
        mbar_arrive(empty_[j % kStages], kWarpThreads);
        if (j > 0) {
          bar(kMax + prev, 256, true);
          expect(max_[(j - 1) % 2], {item, j - 1}, "the running max of the page before");
        }
        put(max_[j % 2], {item, j});
        if (j + 1 < nblk) bar(kMax + c, 256, false);
      }
      if (softmax_first_ && before2) apply(j - 2, prev2);
      jitter(rng);
      if (before2) {
        pv_done(j - 2);
        retire(j - 2);
      }
      if (before1) apply(j - 1, prev);
      if (mine) {  // write_page_p, the factors, the P hand-off
        if (j >= 2) bar(kFree + c, kAll, true);
        jitter(rng);
        put(p_[j % kSlots][wq], {item, j});
        put(factors_[j % kSlots][wq], {item, j});
        bar(kP + c, kAll, false);
      }
      if (before1) {
        jitter(rng);
        pv_done(j - 1);
        retire(j - 1);
      }
      if (mine) {
        bar(kOwnPage + c, 128, true);
        pv(j);
      }
      score(std::min(j + 3, nblk - 1), j + 3 < nblk);  // past the last page, a repeat of the last one
      if (mine) {
        pv_done(j);
        retire(j);
      }
    }
    bar(kAllConsumers, kAll, true);  // sum_consumer_parts
    if (nblk > 0) expect(max_[(nblk - 1) % 2], {item, nblk - 1}, "the lse's running max");
    // Odd splits have one sequence: the rows are assembled in the page stages, then copied out
    // behind the same barrier id.
    if (item % 2 == 1) {
      for (auto& stage : stage_) put(stage, {item, -2});
      bar(kAllConsumers, kAll, true);
    }
  }

  Tag max_[2], factors_[kSlots][4], p_[kSlots][4];
};

// decode_bf16 (version 4b): a producer warpgroup (thread 0 of warp 0 loads; the whole warpgroup
// zeroes a partial last page's tail) and two consumers on pairs of pages (A, B) in a two-stage
// ring, each stage in three load groups (0: the rope box, which then holds the owner's P; 1 + h:
// V half h) with their own full / empty mbarriers; consumer c owns page 2 k + c of pair k, hands
// its P and running max over (kHandOff + 2 c, then kOwnerWarps + 2 c among its own warps), and
// both take PV of both pages for their output half. `a_first`: Bf16QkOrder::kPageAFirst's hand-off
// (consumer 1's QK after consumer 0's, kQkIssued). `early_max`: Bf16MaxHandOff::kEarly (consumer 0
// hands page A's running max over on kEarlyMax before its P; consumer 1 stores page B's P, waits for
// page A's, then hands its own over).
class Bf16Model : public Sim {
 public:
  using Split = PagesOfSplit;
  Bf16Model(std::vector<Split> splits, bool a_first, bool early_max = false)
      : splits_(std::move(splits)), a_first_(a_first), early_max_(early_max) {}

 private:
  enum Id { kHandOff = 1, kOwnerWarps = 2, kTailZero = 5, kAddSums = 1, kQkIssued = 6, kEarlyMax = 7 };
  static constexpr int kGroups = 3;
  static constexpr int kP = 1000;  // a rope box quarter's tag once it holds page j's P: page kP + j
  static constexpr int kWgmma = 12;  // 12, 13: the model's stand-in for a warpgroup's wgmma (not the kernel's)

  static int phase(int j) { return (j / 2) & 1; }
  void reset() override {
    for (int s = 0; s < 2; ++s)
      for (int g = 0; g < kGroups; ++g) {
        full_[s][g] = {kWarpThreads, kWarpThreads, 0};                          // the loader's arrival
        const int readers = (g == 0 ? 8 : 4) * kWarpThreads;                     // rope box / P: both consumers
        empty_[s][g] = {readers, readers, 0};
      }
    qbar_ = {kWarpThreads, kWarpThreads, 0};
    tail_ = {128, 128, 0};
  }
  void warp(int w, std::mt19937& rng) override {
    if (w < 4) producer(w, rng);
    else consumer((w - 4) / 4, (w - 4) % 4, rng);
  }

  void producer(int w, std::mt19937& rng) {
    for (int item = 0; item < int(splits_.size()) && !abort_; ++item) {
      if (item > 0) boundary(w == 0);
      const int nblk = splits_[item].pages;
      if (w == 0) {
        put(q_, {item, -1});
        mbar_arrive(qbar_, kWarpThreads);
        auto load = [&](int j, int g) {
          if (j >= 2) mbar_wait(empty_[j % 2][g], phase(j) ^ 1);
          jitter(rng);
          put(group_[j % 2][g], {item, j});
          if (g == 0)
            for (auto& quarter : rope_[j % 2]) put(quarter, {item, j});
          zeroed_[j % 2][g] = false;
          mbar_arrive(full_[j % 2][g], kWarpThreads);
        };
        for (int a = 0; a < nblk && !abort_; a += 2) {
          load(a, 1), load(a, 2), load(a, 0);
          if (a + 1 < nblk) load(a + 1, 2), load(a + 1, 0), load(a + 1, 1);
        }
      }
      bar(kTailZero, 128, true);
      if (nblk > 0 && splits_[item].partial_last) {
        const int last = nblk - 1;
        mbar_wait(full_[last % 2][1], phase(last));
        mbar_wait(full_[last % 2][2], phase(last));
        for (int g = 1; g <= 2; ++g) {
          expect(group_[last % 2][g], {item, last}, "the tail zeroing writes its page's V");
          zeroed_[last % 2][g] = true;
        }
        mbar_arrive(tail_, kWarpThreads);
      }
    }
  }

  void consumer(int c, int wq, std::mt19937& rng) {
    for (int item = 0; item < int(splits_.size()) && !abort_; ++item) {
      if (item > 0) boundary(false);
      const int nblk = splits_[item].pages;
      const bool partial_last = nblk > 0 && splits_[item].partial_last;
      mbar_wait(qbar_, 0);
      // The QK of page j (its rope box and both V halves' K parts, with Q); a discarded one
      // (`real` false) waits for nothing and its reads are not checked. A wgmma is one operation of
      // the warpgroup: it reads after its last warp issued it and before its first warp sees it
      // done, which the model's own barrier pair of the warpgroup stands for (id kWgmma + c).
      auto qk = [&](int j, bool real) {
        if (a_first_ && c == 1) bar(kQkIssued, 256, true);
        if (real) {
          mbar_wait(full_[j % 2][0], phase(j));
          mbar_wait(full_[j % 2][1 + c], phase(j));
          mbar_wait(full_[j % 2][2 - c], phase(j));
        }
        bar(kWgmma + c, 128, true);
        if (real && wq == 0) {
          for (int g = 0; g < kGroups; ++g) expect(group_[j % 2][g], {item, j}, "QK reads its page's K");
          for (const Tag& quarter : rope_[j % 2]) expect(quarter, {item, j}, "QK reads its page's rope");
          expect(q_, {item, -1}, "QK reads its split's Q");
        }
        bar(kWgmma + c, 128, true);
        if (a_first_ && c == 0) bar(kQkIssued, 256, false);
      };
      auto pv = [&](int j_p, int j_v) {  // P from page j_p's rope box, V half c of page j_v
        for (const Tag& quarter : rope_[j_p % 2]) expect(quarter, {item, kP + j_p}, "PV reads its page's P");
        expect(group_[j_v % 2][1 + c], {item, j_v}, "PV reads its page's V");
        if (partial_last && j_v == nblk - 1 && !zeroed_[j_v % 2][1 + c]) fail("PV reads the last page before its tail is zeroed");
      };
      // The reads of a wgmma last until it completes: checked again where the warp waits for it.
      auto qk_done = [&](int j) {
        for (int g = 0; g < kGroups; ++g) expect(group_[j % 2][g], {item, j}, "QK reads its page's K until it completes");
      };
      auto pv_done = [&](int j_p, int j_v) {
        for (const Tag& quarter : rope_[j_p % 2]) expect(quarter, {item, kP + j_p}, "PV reads its page's P until it completes");
        expect(group_[j_v % 2][1 + c], {item, j_v}, "PV reads its page's V until it completes");
      };
      if (nblk > 0) qk(std::min(c, nblk - 1), c < nblk);
      for (int k = 0; 2 * k < nblk && !abort_; ++k) {
        const int ja = 2 * k, jb = 2 * k + 1, j = ja + c;
        const bool has_b = jb < nblk;
        jitter(rng);
        if (j < nblk) qk_done(j);
        auto hand_off = [&](int owner) {
          if (c == owner) {
            put(rope_[j % 2][wq], {item, kP + j});  // its rows of P (zeros past the last page) over the rope box
            put(xmax_[c][wq], {item, j});  // its rows' running max
            bar(kHandOff + 2 * owner, 256, false);
            bar(kOwnerWarps + 2 * owner, 128, true);
          } else {
            bar(kHandOff + 2 * owner, 256, true);
            expect(xmax_[owner][wq], {item, ja + owner}, "the running max of the other's page");
          }
        };
        if (!early_max_) {
          hand_off(0);
        } else if (c == 0) {
          put(xmax_[0][wq], {item, ja});
          bar(kEarlyMax, 256, false);
          put(rope_[j % 2][wq], {item, kP + j});
          bar(kHandOff, 256, false);
          bar(kOwnerWarps, 128, true);
        } else {
          bar(kEarlyMax, 256, true);
          expect(xmax_[0][wq], {item, ja}, "page A's running max, handed over before its P");
          put(rope_[j % 2][wq], {item, kP + j});
          put(xmax_[1][wq], {item, jb});
          bar(kHandOff, 256, true);
          bar(kHandOff + 2, 256, false);
          bar(kOwnerWarps + 2, 128, true);
        }
        if (partial_last && 2 * k + 2 >= nblk) mbar_wait(tail_, 0);
        pv(ja, ja);
        if (!early_max_) {
          hand_off(1);
        } else if (c == 0) {
          bar(kHandOff + 2, 256, true);
          expect(xmax_[1][wq], {item, jb}, "the running max of the other's page");
        }
        jitter(rng);
        pv_done(ja, ja);
        mbar_arrive(empty_[ja % 2][1 + c], kWarpThreads);
        mbar_arrive(empty_[ja % 2][0], kWarpThreads);
        pv(jb, std::min(jb, nblk - 1));
        jitter(rng);
        pv_done(jb, std::min(jb, nblk - 1));
        if (has_b) {
          mbar_arrive(empty_[jb % 2][1 + c], kWarpThreads);
          mbar_arrive(empty_[jb % 2][0], kWarpThreads);
        }
        if (c == 0 && has_b) mbar_wait(empty_[jb % 2][0], phase(jb));
        qk(std::min(j + 2, nblk - 1), j + 2 < nblk);
      }
      bar(kAddSums, 256, true);
      // The epilogue stages its rows in the Q tile (and the fp32 partials in the stages after it).
      put(q_, {item, -2});
      for (int g = 0; g < kGroups; ++g) put(group_[0][g], {item, -2});
    }
  }

  std::vector<Split> splits_;
  bool a_first_, early_max_;
  std::array<std::array<MBar, kGroups>, 2> full_{}, empty_{};
  std::atomic<bool> zeroed_[2][kGroups] = {};  // the page in the group has its tail zeroed
  MBar qbar_{}, tail_{};
  Tag q_, group_[2][kGroups];
  Tag xmax_[2][4];  // each consumer's running max after its page, by warp (its 16 rows: the same rows in both)
  Tag rope_[2][4];  // each stage's rope box by the consumer warp whose rows of P it takes
};

// decode_bf16's narrow tile (decode_bf16_narrow_kernel): a producer warpgroup (thread 0 streams the
// pages into a two-stage ring, the four warps load the Q tile with cp.async) and one consumer
// warpgroup running the pages in order. Page j's QK is issued under page j - 1's PV and both are
// waited for together; then page j - 1's stage is released, the row maxima go through shared memory
// (kConsumerWarps), P is written (and a partial page's latent sanitized in its stage) before the
// same barrier, and page j's PV reads P and the stage.
class Bf16NarrowModel : public Sim {
 public:
  using Split = PagesOfSplit;
  explicit Bf16NarrowModel(std::vector<Split> splits) : splits_(std::move(splits)) {}

 private:
  static constexpr int kStages = 2;
  enum Id { kConsumerWarps = 1 };

  int warps() const override { return 8; }
  void reset() override {
    for (auto& f : full_) f = {kWarpThreads, kWarpThreads, 0};  // the loader's arrival (with the bytes)
    for (auto& e : empty_) e = {128, 128, 0};                   // every consumer thread
    qbar_ = {128, 128, 0};                                      // every producer thread (cp.async)
  }
  void warp(int w, std::mt19937& rng) override {
    if (w < 4) producer(w, rng);
    else consumer(w - 4, rng);
  }

  void producer(int wq, std::mt19937& rng) {
    auto stream = [&](int item, int from, int to) {
      for (int j = from; j < to && !abort_; ++j) {
        if (j >= kStages) mbar_wait(empty_[j % kStages], ((j / kStages) & 1) ^ 1);
        jitter(rng);
        put(stage_[j % kStages], {item, j});
        mbar_arrive(full_[j % kStages], kWarpThreads);
      }
    };
    for (int item = 0; item < int(splits_.size()) && !abort_; ++item) {
      if (item > 0) boundary(wq == 0);
      const int nblk = splits_[item].pages, first = std::min(kStages, nblk);
      if (wq == 0) stream(item, 0, first);
      jitter(rng);
      put(q_[wq], {item, -1});
      mbar_arrive(qbar_, kWarpThreads);
      if (wq == 0) stream(item, first, nblk);
    }
  }

  void consumer(int wq, std::mt19937& rng) {
    for (int item = 0; item < int(splits_.size()) && !abort_; ++item) {
      if (item > 0) boundary(false);
      const int nblk = splits_[item].pages;
      mbar_wait(qbar_, 0);
      for (int x = 0; x < 4; ++x) expect(q_[x], {item, -1}, "QK reads the split's Q tile");
      // What page j's PV reads: its stage (V) and every warp's rows of P.
      auto pv_reads = [&](int j, const char* when) {
        expect(stage_[j % kStages], {item, j}, when);
        for (int x = 0; x < 4; ++x) expect(p_[x], {item, j}, when);
      };
      for (int j = 0; j < nblk && !abort_; ++j) {
        mbar_wait(full_[j % kStages], (j / kStages) & 1);
        expect(stage_[j % kStages], {item, j}, "QK reads its page's stage");
        jitter(rng);
        // wait<0>: page j's QK and page j - 1's PV retire; their reads were good until now.
        expect(stage_[j % kStages], {item, j}, "QK's page stays until the QK retires");
        if (j > 0) {
          pv_reads(j - 1, "the PV of the page before reads until it retires");
          mbar_arrive(empty_[(j - 1) % kStages], kWarpThreads);
        }
        put(red_[wq], {item, j});
        bar(kConsumerWarps, 128, true);
        for (int x = 0; x < 4; ++x) expect(red_[x], {item, j}, "the row maxima of the page");
        jitter(rng);
        put(p_[wq], {item, j});
        if (splits_[item].partial_last && j + 1 == nblk) expect(stage_[j % kStages], {item, j}, "sanitizes its page's stage");
        bar(kConsumerWarps, 128, true);
        pv_reads(j, "PV reads its page's V and P");
      }
      if (nblk > 0) {
        jitter(rng);
        pv_reads(nblk - 1, "the last PV reads until it retires");
        mbar_arrive(empty_[(nblk - 1) % kStages], kWarpThreads);
      }
      // l over the warps, through the same slots.
      put(red_[wq], {item, -1});
      bar(kConsumerWarps, 128, true);
      for (int x = 0; x < 4; ++x) expect(red_[x], {item, -1}, "the row sums");
    }
  }

  std::vector<Split> splits_;
  std::array<MBar, kStages> full_{}, empty_{};
  MBar qbar_{};
  std::array<Tag, kStages> stage_{};
  Tag q_[4], p_[4], red_[4];
};

TEST(VRegsSyncModel, EveryReadSeesItsPageAndNothingDeadlocks) {
  const std::vector<std::vector<int>> workers = {{0}, {1}, {2}, {3}, {5}, {8}, {9}, {1, 1}, {3, 0, 4},
                                                 {7, 2, 1, 6}, {0, 0}, {16, 1}};
  for (const auto& w : workers)
    for (unsigned seed = 1; seed <= 3; ++seed) {
      VRegsModel m(w);
      std::string pages;
      for (int n : w) pages += std::to_string(n) + " ";
      EXPECT_EQ(m.run(seed), "") << "splits of " << pages << "pages, seed " << seed;
    }
}

// The BF16 models' workers: none, one or several splits of 0-16 pages, with and without a partial
// last page; and a worker's splits as "3p 0 4p " (p: a partial last page).
const std::vector<std::vector<PagesOfSplit>> kBf16Workers = {
    {{0, false}}, {{1, false}}, {{1, true}}, {{2, false}}, {{3, true}}, {{4, false}}, {{5, true}}, {{8, false}},
    {{9, false}}, {{1, true}, {1, false}}, {{3, true}, {0, false}, {4, true}}, {{7, false}, {2, true}, {1, true}},
    {{0, false}, {0, false}}, {{16, true}, {1, false}}};

std::string splits_label(const std::vector<PagesOfSplit>& w) {
  std::string pages;
  for (const PagesOfSplit& x : w) pages += std::to_string(x.pages) + (x.partial_last ? "p " : " ");
  return pages;
}

// Each order of decode_bf16's pairs: the default, page A's QK first (Bf16QkOrder::kPageAFirst) and
// the early max hand-off (Bf16MaxHandOff::kEarly).
TEST(Bf16SyncModel, EveryReadSeesItsPageAndNothingDeadlocksInEachOrder) {
  struct Order {
    bool a_first, early_max;
    const char* label;
  };
  for (const Order order : {Order{false, false, ""}, Order{true, false, ", page A's QK first"},
                            Order{false, true, ", the early max hand-off"}})
    for (const auto& w : kBf16Workers)
      for (unsigned seed = 1; seed <= 3; ++seed) {
        Bf16Model m(w, order.a_first, order.early_max);
        EXPECT_EQ(m.run(seed), "") << "splits of " << splits_label(w) << "pages, seed " << seed << order.label;
      }
}

TEST(Fp8TileSyncModel, EveryReadSeesItsPageAndNothingDeadlocks) {
  const std::vector<std::vector<int>> workers = {{0}, {1}, {2}, {3}, {4}, {5}, {8}, {9}, {1, 1}, {3, 0, 4},
                                                 {7, 2, 1, 6}, {0, 0}, {16, 1}};
  for (const auto& w : workers)
    for (unsigned seed = 1; seed <= 3; ++seed) {
      Fp8TileModel m(w);
      std::string pages;
      for (int n : w) pages += std::to_string(n) + " ";
      EXPECT_EQ(m.run(seed), "") << "splits of " << pages << "pages, seed " << seed;
    }
}

TEST(Fp8TrioSyncModel, EveryReadSeesItsPageAndNothingDeadlocksInEitherOrder) {
  const std::vector<std::vector<int>> workers = {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9}, {1, 1}, {2, 5},
                                                 {3, 0, 4}, {7, 2, 1, 6}, {0, 0}, {16, 1}, {10, 11, 12}};
  for (const bool softmax_first : {false, true})
    for (const auto& w : workers)
      for (unsigned seed = 1; seed <= 3; ++seed) {
        TrioModel m(w, softmax_first);
        std::string pages;
        for (int n : w) pages += std::to_string(n) + " ";
        EXPECT_EQ(m.run(seed), "") << "splits of " << pages << "pages, seed " << seed
                                   << (softmax_first ? ", softmax first" : "");
      }
}

TEST(Bf16NarrowSyncModel, EveryReadSeesItsPageAndNothingDeadlocks) {
  for (const auto& w : kBf16Workers)
    for (unsigned seed = 1; seed <= 3; ++seed) {
      Bf16NarrowModel m(w);
      EXPECT_EQ(m.run(seed), "") << "splits of " << splits_label(w) << "pages, seed " << seed;
    }
}

}  // namespace
