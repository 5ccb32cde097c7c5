// `snapmla accuracy`: SnapMLA against the paper's ablation recipes and the BF16 cache, each
// measured against float64 attention on the unquantized (synthetic) inputs.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <unistd.h>

#include "commands.hpp"
#include "snapmla/reference.hpp"
#include "study/accuracy.hpp"
#include "study/synthetic.hpp"

namespace snapmla::cli {
namespace {

using accuracy::Metrics;
using accuracy::Recipe;
using synthetic::DataKind;

struct Options {
  std::vector<DataKind> data = {DataKind::kMlaLike};
  std::vector<int> lengths = {1024, 4096, 16384, 32768};
  std::vector<int> heads = {16, 128};
  int seeds = 2;
  int seqlen_q = 1;
  std::string json;
  bool quiet = false;
};

void help() {
  std::printf(
      "usage: snapmla accuracy [options]\n"
      "  --data LIST      mla and/or gaussian (default mla: MLA-like synthetic, docs/accuracy.md)\n"
      "  --lengths LIST   cache lengths s_k (default 1024,4096,16384,32768)\n"
      "  --heads LIST     head counts h in 1..128 (default 16,128)\n"
      "  --seeds N        seeds per case (default 2)\n"
      "  --s-q N          queries per sequence, 1..4, causal (default 1)\n"
      "  --json FILE      also write every measurement as JSON\n"
      "  --quiet          no progress lines\n");
}

std::vector<int> parse_ints(const std::string& arg, const std::string& s) {
  std::vector<int> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      const int x = std::stoi(item, &used);
      if (used != item.size() || x <= 0) throw std::invalid_argument(item);
      v.push_back(x);
    } catch (const std::exception&) {
      throw std::invalid_argument(arg + ": expected positive integers separated by commas, got '" + s + "'");
    }
  }
  if (v.empty()) throw std::invalid_argument(arg + ": empty list");
  return v;
}

int parse_int(const std::string& arg, const std::string& s) {
  const std::vector<int> v = parse_ints(arg, s);
  if (v.size() != 1) throw std::invalid_argument(arg + ": expected one positive integer, got '" + s + "'");
  return v[0];
}

// The folder a --json file goes to must exist and be writable before the study runs (minutes),
// not only when its results are written.
void check_writable(const std::string& arg, const std::string& path) {
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    throw std::invalid_argument(arg + ": cannot write '" + path + "': no folder '" + dir.string() + "'");
  if (::access(dir.c_str(), W_OK) != 0)
    throw std::invalid_argument(arg + ": cannot write '" + path + "': folder '" + dir.string() + "' is not writable");
}

Options parse(const std::vector<std::string>& args) {
  Options o;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> const std::string& {
      if (i + 1 >= args.size()) throw std::invalid_argument(a + ": missing value");
      return args[++i];
    };
    if (a == "--data") {
      o.data.clear();
      std::stringstream ss(value());
      std::string item;
      while (std::getline(ss, item, ',')) {
        if (item == "mla") o.data.push_back(DataKind::kMlaLike);
        else if (item == "gaussian") o.data.push_back(DataKind::kGaussian);
        else throw std::invalid_argument("--data: expected mla and/or gaussian, got '" + item + "'");
      }
    } else if (a == "--lengths") {
      o.lengths = parse_ints(a, value());
    } else if (a == "--heads") {
      o.heads = parse_ints(a, value());
      for (int h : o.heads)
        if (h < 1 || h > 128) throw std::invalid_argument("--heads: expected head counts in 1..128");
    } else if (a == "--seeds") {
      o.seeds = parse_int(a, value());
    } else if (a == "--s-q") {
      o.seqlen_q = parse_int(a, value());
      if (o.seqlen_q > 4) throw std::invalid_argument("--s-q: expected 1..4");
    } else if (a == "--json") {
      o.json = value();
      check_writable(a, o.json);
    } else if (a == "--quiet") {
      o.quiet = true;
    } else if (a == "-h" || a == "--help") {
      help();
      std::exit(0);
    } else {
      throw std::invalid_argument("unknown option '" + a + "' (see --help)");
    }
  }
  return o;
}

struct Row {
  DataKind data;
  int h, s_k, seed;
  Recipe recipe;
  Metrics m;
};

struct Agg {
  double sum_rel = 0, max_rel = 0, sum_cos = 0, min_cos = 1, max_lse = 0;
  int n = 0;
  void add(const Metrics& m) {
    sum_rel += m.rel_l2;
    max_rel = std::max(max_rel, m.rel_l2);
    sum_cos += m.cosine;
    min_cos = std::min(min_cos, m.cosine);
    max_lse = std::max(max_lse, m.max_lse_err);
    ++n;
  }
};

// JSON has no inf/NaN: a non-finite metric is written as null.
std::string json_num(double v, const char* fmt) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

}  // namespace

int accuracy_command(const std::vector<std::string>& args) {
  const Options o = parse(args);
  std::printf("SnapMLA accuracy ablation on the CPU (%d threads): decode output vs float64 attention\n"
              "on the unquantized inputs. Data is synthetic (real weights are not available here).\n",
              ref::num_threads());
  std::printf("s_q=%d, %d seed(s) per case, batch of one sequence per case; P' quantized per row and block of %d\n"
              "tokens, the kernels' block (the reference also runs 128 and 256: docs/reference.md).\n\n",
              o.seqlen_q, o.seeds, kPageSize);
  for (Recipe r : accuracy::kAllRecipes)
    std::printf("  %-13s %s\n", accuracy::name(r).c_str(), accuracy::description(r).c_str());
  std::printf("\n");

  std::vector<Row> rows;
  std::map<std::tuple<int, int>, double> eff_tokens;  // (data, s_k) -> mean over seeds/heads
  const int total = int(o.data.size() * o.heads.size() * o.lengths.size()) * o.seeds;
  int done = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (DataKind data : o.data)
    for (int h : o.heads)
      for (int s_k : o.lengths)
        for (int seed = 0; seed < o.seeds; ++seed) {
          const auto tc = std::chrono::steady_clock::now();
          synthetic::Config cfg{data, uint64_t(seed), s_k, o.seqlen_q, h};
          const synthetic::Sequence seq = synthetic::make_sequence(cfg);
          const accuracy::Truth truth = accuracy::ground_truth(seq);
          eff_tokens[{int(data), s_k}] += truth.effective_tokens / (o.seeds * o.heads.size());
          for (Recipe r : accuracy::kAllRecipes)
            rows.push_back({data, h, s_k, seed, r, accuracy::evaluate(r, seq, truth)});
          ++done;
          if (!o.quiet) {
            const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - tc).count();
            const double all = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            std::fprintf(stderr, "[%3d/%d] data=%-8s h=%-3d s_k=%-6d seed=%d  %.1f s (elapsed %.0f s)\n",
                         done, total, synthetic::to_string(data).c_str(), h, s_k, seed, dt, all);
          }
        }

  // Per case: mean over seeds.
  std::printf("Relative L2 error of the output (mean over seeds; lower is better)\n");
  std::printf("%-9s %4s %7s %8s |", "data", "h", "s_k", "eff.tok");
  for (Recipe r : accuracy::kAllRecipes) std::printf(" %12s", accuracy::name(r).c_str());
  std::printf("\n");
  for (DataKind data : o.data)
    for (int h : o.heads)
      for (int s_k : o.lengths) {
        std::printf("%-9s %4d %7d %8.1f |", synthetic::to_string(data).c_str(), h, s_k,
                    eff_tokens[{int(data), s_k}]);
        for (Recipe r : accuracy::kAllRecipes) {
          Agg a;
          for (const Row& row : rows)
            if (row.data == data && row.h == h && row.s_k == s_k && row.recipe == r) a.add(row.m);
          std::printf(" %12.3e", a.sum_rel / a.n);
        }
        std::printf("\n");
      }

  // Summary per data kind, ranked by the measured mean relative L2.
  for (DataKind data : o.data) {
    std::vector<std::pair<Recipe, Agg>> sum;
    for (Recipe r : accuracy::kAllRecipes) {
      Agg a;
      for (const Row& row : rows)
        if (row.data == data && row.recipe == r) a.add(row.m);
      sum.push_back({r, a});
    }
    std::stable_sort(sum.begin(), sum.end(), [](const auto& x, const auto& y) {
      return x.second.sum_rel / x.second.n < y.second.sum_rel / y.second.n;
    });
    std::printf("\nSummary, data=%s (all h, s_k, seeds), ranked by mean relative L2:\n",
                synthetic::to_string(data).c_str());
    std::printf("  %-4s %-13s %12s %12s %12s %12s %14s\n", "rank", "recipe", "mean rel-L2",
                "max rel-L2", "mean cosine", "min cosine", "max |lse err|");
    int rank = 1;
    for (const auto& [r, a] : sum)
      std::printf("  %-4d %-13s %12.3e %12.3e %12.6f %12.6f %14.3e\n", rank++,
                  accuracy::name(r).c_str(), a.sum_rel / a.n, a.max_rel, a.sum_cos / a.n,
                  a.min_cos, a.max_lse);
  }

  if (!o.json.empty()) {
    std::ofstream f(o.json);
    if (!f) throw std::runtime_error("--json: cannot write " + o.json);
    f << "{\n  \"tool\": \"snapmla accuracy\",\n  \"date\": \"" << iso_date()
      << "\",\n  \"device\": \"cpu (reference emulation)\",\n"
      << "  \"data_note\": \"synthetic data shaped like MLA caches (docs/accuracy.md); no real model weights\",\n"
      << "  \"seqlen_q\": " << o.seqlen_q << ",\n  \"p_block_tokens\": " << kPageSize << ",\n  \"results\": [\n";
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      char buf[512];
      std::snprintf(buf, sizeof buf,
                    "    {\"data\": \"%s\", \"h\": %d, \"s_k\": %d, \"seed\": %d, \"recipe\": \"%s\", "
                    "\"rel_l2\": %s, \"cosine\": %s, \"max_lse_err\": %s}%s\n",
                    synthetic::to_string(r.data).c_str(), r.h, r.s_k, r.seed,
                    accuracy::name(r.recipe).c_str(), json_num(r.m.rel_l2, "%.6e").c_str(),
                    json_num(r.m.cosine, "%.9f").c_str(), json_num(r.m.max_lse_err, "%.6e").c_str(),
                    i + 1 < rows.size() ? "," : "");
      f << buf;
    }
    f << "  ]\n}\n";
    std::printf("\nwrote %s\n", o.json.c_str());
  }
  return 0;
}

}  // namespace snapmla::cli
