// The `snapmla` tool's commands and the small helpers they share.
#pragma once
#include <ctime>
#include <string>
#include <vector>

namespace snapmla::cli {

// Today's date (UTC) as YYYY-MM-DD, for result files.
inline std::string iso_date() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::gmtime(&t));
  return buf;
}

// `snapmla bench --help`: every option (printed in every build; the bench itself needs CUDA).
inline const char* bench_help() {
  return "usage: snapmla bench [options]   (CUDA builds, on an sm_90 GPU)\n"
         "\n"
         "Times decode_fp8 against decode_bf16 (CUDA events; median of the repetitions, two\n"
         "interleaved rounds per kernel), plus copy bandwidth, append and gather_dequant. Without\n"
         "--case it runs the grid: b = 128, h in {128, 64, 16}, s_q in {1, 2}, s_k in 4K..32K, plus\n"
         "h = 8 (s_q = 1, 8K), b = 32 at 64K and b = 128 with lengths uniform in 1..32768.\n"
         "\n"
         "options:\n"
         "  --case b,h,s_q,s_k  time only this case (repeatable): batch b, h heads (1..128), s_q\n"
         "                      queries per sequence (1..4), every sequence s_k tokens; s_k = U\n"
         "                      draws the lengths uniformly from 1..32768. Skips the bandwidth part.\n"
         "  --quick             the grid at s_k = 8192 only\n"
         "  --reps N            timed repetitions per kernel and round (default 20)\n"
         "  --passes N          run the whole grid N times with fresh inputs and report, per case,\n"
         "                      the pass with the median fp8 time (default 1; the GPU's clock under\n"
         "                      its power limit moves single runs by a few percent)\n"
         "  --json FILE         also write the results as JSON\n"
         "  --md FILE           also write the results as a Markdown table\n"
         "  --commit C          the commit recorded in the JSON / Markdown (default \"unknown\")\n"
         "  -h, --help          this text\n"
         "\n"
         "decode_fp8 runs its narrow tile where h * s_q <= 16, else the 64-row one\n"
         "(DecodeOptions::fp8_tile).\n";
}

int accuracy_command(const std::vector<std::string>& args);
int bench_command(const std::vector<std::string>& args);  // CUDA builds only
}
