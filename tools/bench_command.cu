// `snapmla bench`: decode_fp8 and decode_bf16 timed side by side in the same run (CUDA events,
// warm-up, medians), plus append and gather_dequant against the device copy bandwidth.
// Every number is reported with its floor from the performance model (docs/design.md).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/device_buffer.hpp"
#include "commands.hpp"
#include "gpu_monitor.hpp"
#include "snapmla/snapmla.hpp"

namespace snapmla::cli {
namespace {

using device_memory::cuda_ok;
using device_memory::DeviceBuffer;

// Measured dense GEMM rates of one H200 (docs/design.md, performance model); the copy
// bandwidth is re-measured each run.
constexpr double kFp8Tflops = 1228.0, kBf16Tflops = 665.0;

__global__ void fill_kv_kernel(uint16_t* kv, int64_t n, uint64_t seed, float rope_amp = 300.f) {
  // Hash-based pseudo-random bf16 values: latent ~ U(-4, 4), rope ~ U(-rope_amp, rope_amp).
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n * kHeadDim;
       i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t z = (uint64_t(i) + seed) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float u = float(z >> 40) * (1.0f / 16777216.0f) * 2.f - 1.f;
    const int d = int(i % kHeadDim);
    const float v = d < kLatentDim ? 4.f * u : rope_amp * u;
    kv[i] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
  }
}

struct Case {
  int b, h, s_q, s_k;   // s_k = 0: lengths uniform in 1..32768
  bool random_lengths = false;
};

struct Result {
  Case c;
  double fp8_us, bf16_us, tokens;
};

double median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Times fn() with events: `warmup` untimed calls, then `reps` timed ones; median in us. Before
// each timed call the GPU clears a 256 MB buffer (as triton.do_bench does): the call finds nothing of its inputs in L2, and the GPU is busy
// while the host enqueues the call, so the interval between the events holds the call's GPU work
// and not the host's launch work (tensor maps, argument checks, two launches: ~15-25 us that an
// engine replaying a CUDA graph does not pay). No synchronization until all reps are enqueued.
template <typename Fn>
double time_us(Fn&& fn, int warmup, int reps) {
  static DeviceBuffer<uint8_t>* const flush = new DeviceBuffer<uint8_t>(size_t(256) << 20);  // kept to exit
  std::vector<cudaEvent_t> ev(2 * size_t(reps));
  for (auto& e : ev) cuda_ok(cudaEventCreate(&e), "event");
  for (int i = 0; i < warmup; ++i) fn(i);
  for (int i = 0; i < reps; ++i) {
    cuda_ok(cudaMemsetAsync(flush->get(), i & 0xFF, flush->size()), "L2 flush");
    cuda_ok(cudaEventRecord(ev[2 * i]), "record");
    fn(i);
    cuda_ok(cudaEventRecord(ev[2 * i + 1]), "record");
  }
  cuda_ok(cudaEventSynchronize(ev.back()), "sync");
  std::vector<float> ms(reps);
  for (int i = 0; i < reps; ++i) cuda_ok(cudaEventElapsedTime(&ms[i], ev[2 * i], ev[2 * i + 1]), "elapsed");
  for (auto& e : ev) cudaEventDestroy(e);
  cuda_ok(cudaGetLastError(), "timed launches");
  return median(ms) * 1000.0;
}

// One input set of a case: its own shuffled page pool, FP8 and BF16 caches (filled through
// append, every slot) and queries, over the case's lengths. The timings rotate over kInputSets
// of them, so that neither L2 nor one placement of the pages in memory decides a median.
constexpr int kInputSets = 2;
struct InputSet {
  DeviceBuffer<e4m3> latent;
  DeviceBuffer<float> scale;
  DeviceBuffer<bf16> rope, cache16, q, qr;
  DeviceBuffer<e4m3> qn;
  DeviceBuffer<float> qs;
  DeviceBuffer<int32_t> table;
  PagedFp8Cache fp8;
  PagedBf16Cache c16;
  QueryBf16 q16;
  QuantizedQuery qq;
  PageTable pages;

  InputSet(const Case& c, const std::vector<int32_t>& lens, const int32_t* glens, int max_pages,
           int64_t total_pages, std::mt19937_64& rng)
      : latent(size_t(total_pages) * kPageSize * kLatentDim),
        scale(size_t(total_pages) * kPageSize),
        rope(size_t(total_pages) * kPageSize * kRopeDim),
        cache16(size_t(total_pages) * kPageSize * kHeadDim),
        q(size_t(c.b) * c.s_q * c.h * kHeadDim),
        qr(size_t(c.b) * c.s_q * c.h * kRopeDim),
        qn(size_t(c.b) * c.s_q * c.h * kLatentDim),
        qs(size_t(c.b) * c.s_q * c.h),
        table(size_t(c.b) * max_pages) {
    const Device gpu = Device::cuda(0);
    // Pages of all sequences in one shuffled pool.
    std::vector<int32_t> perm(total_pages);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<int32_t> host_table(size_t(c.b) * max_pages, 0);
    int64_t next = 0;
    for (int i = 0; i < c.b; ++i)
      for (int j = 0; j < (lens[i] + kPageSize - 1) / kPageSize; ++j)
        host_table[size_t(i) * max_pages + j] = perm[next++];
    table.upload(host_table);
    fp8 = {latent.get(), scale.get(), rope.get(), total_pages, gpu};
    c16 = {cache16.get(), total_pages, gpu};
    // Fill every page through append, in chunks of pages (all slots: also the tails of pages).
    const int64_t chunk_pages = 8192;
    DeviceBuffer<bf16> kv(size_t(chunk_pages) * kPageSize * kHeadDim);
    DeviceBuffer<int32_t> slots(size_t(chunk_pages) * kPageSize);
    for (int64_t p0 = 0; p0 < total_pages; p0 += chunk_pages) {
      const int64_t np = std::min(chunk_pages, total_pages - p0), n = np * kPageSize;
      fill_kv_kernel<<<1024, 256>>>(reinterpret_cast<uint16_t*>(kv.get()), n, uint64_t(p0) * 7919 + rng());
      std::vector<int32_t> s(chunk_pages * kPageSize);
      std::iota(s.begin(), s.begin() + n, int32_t(p0 * kPageSize));
      slots.upload(s);
      append(fp8, {kv.get(), n, gpu}, {slots.get(), n, gpu});
      append(c16, {kv.get(), n, gpu}, {slots.get(), n, gpu});
    }
    const int rows = c.s_q * c.h;
    fill_kv_kernel<<<256, 256>>>(reinterpret_cast<uint16_t*>(q.get()), int64_t(c.b) * rows, rng(), 0.01f);
    q16 = {q.get(), c.b, c.s_q, c.h, gpu};
    qq = {qn.get(), qr.get(), qs.get(), c.b, c.s_q, c.h, gpu};
    quantize_query(q16, qq);
    pages = {table.get(), glens, c.b, max_pages, gpu};
  }
};

Result run_case(const Case& c, int reps, std::mt19937_64& rng) {
  const Device gpu = Device::cuda(0);
  std::vector<int32_t> lens(c.b, c.s_k);
  if (c.random_lengths)
    for (auto& l : lens) l = 1 + int32_t(rng() % 32768);
  const int max_len = *std::max_element(lens.begin(), lens.end());
  const int max_pages = (max_len + kPageSize - 1) / kPageSize;
  int64_t total_pages = 0;
  for (int l : lens) total_pages += (l + kPageSize - 1) / kPageSize;
  DeviceBuffer<int32_t> glens(lens);
  std::vector<std::unique_ptr<InputSet>> sets;
  for (int k = 0; k < kInputSets; ++k)
    sets.push_back(std::make_unique<InputSet>(c, lens, glens.get(), max_pages, total_pages, rng));
  const int rows = c.s_q * c.h;
  DeviceBuffer<bf16> out(size_t(c.b) * rows * kLatentDim);
  DeviceBuffer<float> lse(size_t(c.b) * rows);
  const int workers = recommended_num_workers(gpu, c.s_q, c.h);
  const int cap = split_plan_capacity(c.b, workers);
  DeviceBuffer<int32_t> off(c.b + 1), beg(cap), ord(cap);
  DeviceBuffer<uint8_t> ws(decode_workspace_bytes(cap, c.s_q, c.h));
  SplitPlan plan{off.get(), beg.get(), cap, c.b, gpu, ord.get()};
  DecodeOptions opt;
  opt.softmax_scale = 1.0f / std::sqrt(192.0f);
  opt.plan = &plan;
  opt.workspace = ws.get();
  opt.workspace_bytes = ws.size();
  DecodeOutput o{out.get(), lse.get(), gpu};
  cuda_ok(cudaDeviceSynchronize(), "setup");
  Result r{c, 0, 0, double(std::accumulate(lens.begin(), lens.end(), 0.0))};
  // Interleave the two so both see the same clocks and thermal state.
  double f = 0, g = 0;
  // The plan an engine makes: once per step (it depends on the lengths only), given the query
  // rows so that a small total is not cut into splits shorter than they are worth.
  plan_splits(sets[0]->pages, workers, plan, nullptr, c.s_q * c.h);
  for (int round = 0; round < 2; ++round) {
    f += time_us([&](int i) { const InputSet& s = *sets[i % kInputSets]; decode_fp8(s.qq, s.fp8, s.pages, o, opt); },
                 3, reps);
    g += time_us([&](int i) { const InputSet& s = *sets[i % kInputSets]; decode_bf16(s.q16, s.c16, s.pages, o, opt); },
                 3, reps);
  }
  r.fp8_us = f / 2;
  r.bf16_us = g / 2;
  return r;
}

struct Floors {
  double fp8_us, bf16_us;
};

Floors floors(const Result& r, double copy_tbs) {
  const double rows_tokens = r.tokens * r.c.s_q * r.c.h;
  const double fp8_mem = r.tokens * 644 / (copy_tbs * 1e12) * 1e6;
  const double fp8_cmp = (2.0 * 1024 * rows_tokens / (kFp8Tflops * 1e12) + 2.0 * 64 * rows_tokens / (kBf16Tflops * 1e12)) * 1e6;
  const double bf_mem = r.tokens * 1152 / (copy_tbs * 1e12) * 1e6;
  const double bf_cmp = 2.0 * 1088 * rows_tokens / (kBf16Tflops * 1e12) * 1e6;
  return {std::max(fp8_mem, fp8_cmp), std::max(bf_mem, bf_cmp)};
}

}  // namespace

int bench_command(const std::vector<std::string>& args) {
  std::string json, md, commit = "unknown";
  bool quick = false;
  int reps = 20, passes = 1;
  std::vector<Case> only;  // --case b,h,s_q,s_k (repeatable): just these, no bandwidth section
  for (size_t i = 0; i < args.size(); ++i) {
    auto value = [&]() -> std::string {
      if (i + 1 >= args.size()) throw std::invalid_argument(args[i] + ": missing value");
      return args[++i];
    };
    if (args[i] == "--json") json = value();
    else if (args[i] == "--md") md = value();
    else if (args[i] == "--commit") commit = value();
    else if (args[i] == "--reps") reps = std::stoi(value());
    else if (args[i] == "--passes") {
      passes = std::stoi(value());
      if (passes < 1) throw std::invalid_argument("--passes: expected >= 1");
    }
    else if (args[i] == "--quick") quick = true;
    else if (args[i] == "--case") {
      Case c{};
      const std::string v = value();
      char rest = 0;  // s_k = U: lengths uniform in 1..32768
      const bool uniform = std::sscanf(v.c_str(), "%d,%d,%d,%c", &c.b, &c.h, &c.s_q, &rest) == 4 && rest == 'U';
      if (uniform) c.random_lengths = true;
      else if (std::sscanf(v.c_str(), "%d,%d,%d,%d", &c.b, &c.h, &c.s_q, &c.s_k) != 4 || c.b < 1 || c.s_k < 1)
        throw std::invalid_argument("--case: expected b,h,s_q,s_k or b,h,s_q,U (e.g. 128,128,1,8192)");
      only.push_back(c);
    } else if (args[i] == "--help" || args[i] == "-h") {
      std::printf("%s", bench_help());
      return 0;
    } else
      throw std::invalid_argument("unknown option '" + args[i] + "' (snapmla bench --help lists the options)");
  }
  if (!cuda_device_available()) {
    std::printf("snapmla bench: no sm_90 GPU here; nothing to time (run it on an H100/H200)\n");
    return 2;
  }
  cudaDeviceProp prop{};
  cuda_ok(cudaGetDeviceProperties(&prop, 0), "props");
  char pci[32] = {};
  cuda_ok(cudaDeviceGetPCIBusId(pci, sizeof pci, 0), "PCI bus id");
  GpuMonitor mon(pci);
  std::mt19937_64 rng(1234);

  // Copy bandwidth (read + write) of a 4 GiB buffer: the memory ceiling for everything below.
  const size_t copy_bytes = only.empty() ? size_t(2) << 30 : size_t(256) << 20;
  DeviceBuffer<uint8_t> a(copy_bytes), b(copy_bytes);
  const double copy_us = time_us([&](int) { cuda_ok(cudaMemcpyAsync(b.get(), a.get(), copy_bytes, cudaMemcpyDeviceToDevice), "copy"); }, 3, 10);
  const double copy_tbs = 2.0 * copy_bytes / (copy_us * 1e-6) / 1e12;
  std::printf("GPU: %s, %d SMs; device copy %.2f TB/s (read + write); SM clock %s\n\n", prop.name,
              prop.multiProcessorCount, copy_tbs,
              mon.available() ? "sampled through NVML every 1 ms (reported per pass of the grid)" : "not sampled (no NVML)");

  // append and gather_dequant over 4M tokens.
  double append_tbs = 0, gather_tbs = 0;
  if (only.empty()) {
    const Device gpu = Device::cuda(0);
    const int64_t n = 1 << 22, pages = n / kPageSize;
    DeviceBuffer<bf16> kv(size_t(n) * kHeadDim), back(size_t(n) * kHeadDim);
    fill_kv_kernel<<<1024, 256>>>(reinterpret_cast<uint16_t*>(kv.get()), n, 99);
    DeviceBuffer<e4m3> lat(size_t(n) * kLatentDim);
    DeviceBuffer<float> sc(n);
    DeviceBuffer<bf16> ro(size_t(n) * kRopeDim);
    std::vector<int32_t> s(n);
    std::iota(s.begin(), s.end(), 0);
    std::shuffle(s.begin(), s.end(), rng);
    DeviceBuffer<int32_t> slots(s);
    PagedFp8Cache cache{lat.get(), sc.get(), ro.get(), pages, gpu};
    const double app = time_us([&](int) { append(cache, {kv.get(), n, gpu}, {slots.get(), n, gpu}); }, 3, 20);
    const double gat = time_us([&](int) { gather_dequant(cache, {slots.get(), n, gpu}, {back.get(), n, gpu}); }, 3, 20);
    const double bytes = double(n) * (1152 + 644);
    append_tbs = bytes / (app * 1e-6) / 1e12;
    gather_tbs = bytes / (gat * 1e-6) / 1e12;
    std::printf("append (4M tokens, shuffled slots): %8.1f us  %.2f TB/s = %3.0f%% of copy\n", app,
                bytes / (app * 1e-6) / 1e12, 100 * bytes / (app * 1e-6) / 1e12 / copy_tbs);
    std::printf("gather_dequant (4M tokens):         %8.1f us  %.2f TB/s = %3.0f%% of copy\n\n", gat,
                bytes / (gat * 1e-6) / 1e12, 100 * bytes / (gat * 1e-6) / 1e12 / copy_tbs);
  }

  std::vector<Case> cases = only;
  const std::vector<int> ks = quick ? std::vector<int>{8192} : std::vector<int>{4096, 8192, 16384, 32768};
  if (only.empty()) {
    for (int s_q : {1, 2})
      for (int h : {128, 64, 16})
        for (int s_k : ks) cases.push_back({128, h, s_q, s_k});
    cases.push_back({128, 8, 1, 8192});  // 8 heads per GPU (DeepSeek-V3 at TP16, Kimi-K2 at TP8)
    cases.push_back({32, 128, 1, 65536});
    cases.push_back({128, 128, 1, 0, true});
  }

  auto print_row = [&](const Result& r) {
    const Case& c = r.c;
    const Floors fl = floors(r, copy_tbs);
    const double flops = 2.0 * 1088 * r.tokens * c.s_q * c.h;
    std::printf("%4d %4d %4d %7s | %9.1f %9.1f %6.2f | %7.2f %7.0f %7.0f%% | %7.0f %7.0f%%\n", c.b, c.h, c.s_q,
                c.random_lengths ? "U(1,32K)" : std::to_string(c.s_k).c_str(), r.fp8_us, r.bf16_us,
                r.bf16_us / r.fp8_us, r.tokens * 644 / (r.fp8_us * 1e-6) / 1e12, flops / (r.fp8_us * 1e-6) / 1e12,
                100 * fl.fp8_us / r.fp8_us, flops / (r.bf16_us * 1e-6) / 1e12, 100 * fl.bf16_us / r.bf16_us);
    std::fflush(stdout);
  };
  auto print_header = [] {
    std::printf("%4s %4s %4s %7s | %9s %9s %6s | %7s %7s %8s | %7s %7s\n", "b", "h", "s_q", "s_k", "fp8 us",
                "bf16 us", "ratio", "fp8TB/s", "fp8 TF", "fp8 %flr", "bf16 TF", "bf16%flr");
  };
  // The grid `passes` times, each case with fresh input sets (new allocations, page shuffles):
  // separate runs of the same binary differ by up to ~10% on some cases, more than the spread
  // within a run. Per case the pass with the median fp8 time is reported (its bf16 time is from
  // the same pass, so the ratio stays a same-run one).
  std::vector<std::vector<Result>> by_pass(static_cast<size_t>(passes));
  std::vector<GpuMonitor::Stats> pass_gpu;
  for (int ps = 0; ps < passes; ++ps) {
    if (passes > 1) std::printf("pass %d of %d\n", ps + 1, passes);
    print_header();
    const size_t m = mon.mark();
    for (const Case& c : cases) {
      by_pass[size_t(ps)].push_back(run_case(c, reps, rng));
      print_row(by_pass[size_t(ps)].back());
    }
    pass_gpu.push_back(mon.stats_since(m));
    if (pass_gpu.back().samples > 0)
      std::printf("SM clock over the pass: mean %.0f MHz, software power cap holding it down in %.0f%% of %d samples\n",
                  pass_gpu.back().sm_mhz, 100 * pass_gpu.back().power_capped, pass_gpu.back().samples);
  }
  std::vector<Result> results;
  std::vector<std::vector<double>> fp8_passes(cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    std::vector<const Result*> rs;
    for (const auto& pass : by_pass) {
      rs.push_back(&pass[i]);
      fp8_passes[i].push_back(pass[i].fp8_us);
    }
    std::sort(rs.begin(), rs.end(), [](const Result* x, const Result* y) { return x->fp8_us < y->fp8_us; });
    results.push_back(*rs[rs.size() / 2]);
  }
  if (passes > 1) {
    std::printf("\nper case, the pass with the median fp8 time (of %d)\n", passes);
    print_header();
    for (const Result& r : results) print_row(r);
  }

  if (!json.empty()) {
    std::ofstream f(json);
    f << "{\n  \"gpu\": \"" << prop.name << "\",\n  \"date\": \"" << iso_date() << "\",\n  \"commit\": \"" << commit
      << "\",\n  \"copy_tb_s\": " << copy_tbs << ",\n  \"passes\": " << passes;
    // A JSON array of value(k) for k < n.
    auto list = [&](size_t n, auto value) {
      f << "[";
      for (size_t k = 0; k < n; ++k) f << (k ? ", " : "") << value(k);
      f << "]";
    };
    if (mon.available()) {
      f << ",\n  \"pass_sm_mhz\": ";
      list(pass_gpu.size(), [&](size_t k) { return std::lround(pass_gpu[k].sm_mhz); });
      f << ",\n  \"pass_power_capped\": ";
      list(pass_gpu.size(), [&](size_t k) { return pass_gpu[k].power_capped; });
    }
    f << ",\n  \"cases\": [\n";
    for (size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      f << "    {\"b\": " << r.c.b << ", \"h\": " << r.c.h << ", \"s_q\": " << r.c.s_q << ", \"s_k\": "
        << (r.c.random_lengths ? "\"U(1,32768)\"" : std::to_string(r.c.s_k)) << ", \"tokens\": " << static_cast<long long>(r.tokens)
        << ", \"fp8_us\": " << r.fp8_us << ", \"bf16_us\": " << r.bf16_us << ", \"fp8_us_passes\": ";
      list(fp8_passes[i].size(), [&](size_t k) { return fp8_passes[i][k]; });
      f << "}" << (i + 1 < results.size() ? "," : "") << "\n";
    }
    f << "  ]\n}\n";
  }
  if (!md.empty()) {
    std::ofstream f(md);
    f << "# decode on one " << prop.name << " (" << iso_date() << ", commit " << commit << ")\n\n"
      << "`snapmla bench`: median of " << reps << " CUDA-event timings x 2 interleaved rounds per kernel, "
      << (passes > 1 ? "the grid run " + std::to_string(passes) +
                           " times with fresh input sets and per case the pass with the median fp8 time (fp8 us "
                           "range: min-max over the passes), "
                     : std::string())
      << "decode + combine per call (the plan is made once per step, untimed), calls rotating over " << kInputSets
      << " input sets (page pools, caches, queries), each call after a 256 MB L2 clear as "
      << "triton.do_bench does (the interval holds the GPU work, not the host's launch work), pages shuffled, random "
      << "data. Device copy " << copy_tbs
      << " TB/s. Floor = max(bytes / copy bandwidth, FLOPs at the measured GEMM rates: fp8 1228, bf16 665 TF).\n\n"
      << "append (4M tokens, shuffled slots, reads 1152 B and writes 644 B per token): " << append_tbs << " TB/s = "
      << 100 * append_tbs / copy_tbs << "% of copy; gather_dequant (reads 644, writes 1152 B per token): " << gather_tbs
      << " TB/s = " << 100 * gather_tbs / copy_tbs << "% of copy.\n\n"
      << "Peers (FlashMLA's BF16 kernel and its FP8 fork) timed in the same run: `python -m snapmla.bench --peers DIR`.\n\n";
    if (mon.available()) {
      f << "SM clock as NVML reports it (the clock the driver set, sampled every 1 ms; 1980 MHz is the maximum; "
        << "under this load the GPU is at its 700 W limit, and the SMs' own clock can be lower still - "
        << "docs/design.md, performance model):";
      for (size_t k = 0; k < pass_gpu.size(); ++k)
        f << (k ? ";" : "") << " pass " << k + 1 << " mean " << std::lround(pass_gpu[k].sm_mhz) << " MHz, power cap active in "
          << std::lround(100 * pass_gpu[k].power_capped) << "% of samples";
      f << ".\n\n";
    }
    f << "| b | h | s_q | s_k | fp8 us | fp8 us range | bf16 us | bf16/fp8 | fp8 TB/s | fp8 TFLOPS | fp8 % of floor | bf16 % of floor |\n"
      << "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n";
    for (size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      const auto [lo, hi] = std::minmax_element(fp8_passes[i].begin(), fp8_passes[i].end());
      char range[64];
      std::snprintf(range, sizeof range, "%.1f-%.1f", *lo, *hi);
      const Floors fl = floors(r, copy_tbs);
      const double flops = 2.0 * 1088 * r.tokens * r.c.s_q * r.c.h;
      char line[512];
      std::snprintf(line, sizeof line, "| %d | %d | %d | %s | %.1f | %s | %.1f | %.2f | %.2f | %.0f | %.0f%% | %.0f%% |\n", r.c.b,
                    r.c.h, r.c.s_q, r.c.random_lengths ? "U(1,32768)" : std::to_string(r.c.s_k).c_str(), r.fp8_us,
                    range, r.bf16_us, r.bf16_us / r.fp8_us, r.tokens * 644 / (r.fp8_us * 1e-6) / 1e12,
                    flops / (r.fp8_us * 1e-6) / 1e12, 100 * fl.fp8_us / r.fp8_us, 100 * fl.bf16_us / r.bf16_us);
      f << line;
    }
  }
  return 0;
}

}  // namespace snapmla::cli
