// `snapmla`: the project's command-line tool.
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "commands.hpp"
#include "snapmla/reference.hpp"
#include "snapmla/snapmla.hpp"

namespace {

constexpr const char* kVersion = SNAPMLA_VERSION;

void usage() {
  std::printf(
      "usage: snapmla <command> [options]\n"
      "\n"
      "commands:\n"
      "  accuracy   the paper's quantization ablation on the CPU against float64 truth\n"
      "             (snapmla accuracy --help for options)\n"
      "  bench      time decode_fp8 against decode_bf16 on the GPU (CUDA builds)\n"
      "  info       what this build and machine can run\n"
      "\n"
      "  snapmla --version   the version; snapmla <command> --help   a command's options\n");
}

int info() {
  std::printf("SnapMLA %s\n", kVersion);
  std::printf("  CUDA kernels in this build: %s\n", snapmla::built_with_cuda() ? "yes" : "no");
  std::printf("  usable sm_90 GPU:           %s\n",
              snapmla::cuda_device_available() ? "yes" : "no (the CPU reference runs instead)");
  std::printf("  CPU reference threads:      %d\n", snapmla::ref::num_threads());
  std::printf("  FP8 cache: %zu B/token, BF16 cache: %zu B/token\n",
              snapmla::PagedFp8Cache::bytes_per_token, snapmla::PagedBf16Cache::bytes_per_token);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
    usage();
    return args.empty() ? 2 : 0;
  }
  if (args[0] == "--version" || args[0] == "-V") {
    std::printf("snapmla %s\n", kVersion);
    return 0;
  }
  const std::string cmd = args[0];
  args.erase(args.begin());
  const bool help = !args.empty() && (args[0] == "--help" || args[0] == "-h");
  if (cmd == "bench" && help) {
    std::printf("%s", snapmla::cli::bench_help());
    return 0;
  }
  if (cmd == "info") {
    if (help) {
      std::printf(
          "usage: snapmla info\n"
          "  what this build and machine can run (CUDA kernels, an sm_90 GPU, the CPU\n"
          "  reference's threads, the caches' bytes per token); no options\n");
      return 0;
    }
    if (!args.empty()) {
      std::fprintf(stderr, "snapmla info: error: unknown option '%s' (info takes none; see --help)\n",
                   args[0].c_str());
      return 2;
    }
  }
  try {
    if (cmd == "accuracy") return snapmla::cli::accuracy_command(args);
    if (cmd == "info") return info();
    if (cmd == "bench") {
#if SNAPMLA_HAVE_CUDA
      return snapmla::cli::bench_command(args);
#else
      std::fprintf(stderr, "snapmla bench: this build has no CUDA kernels (nvcc was not found)\n");
      return 2;
#endif
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "snapmla %s: error: %s\n", cmd.c_str(), e.what());
    return 1;
  }
  std::fprintf(stderr, "snapmla: unknown command '%s'\n\n", cmd.c_str());
  usage();
  return 2;
}
