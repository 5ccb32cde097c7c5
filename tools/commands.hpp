#pragma once
#include <string>
#include <vector>

namespace snapmla::cli {
int accuracy_command(const std::vector<std::string>& args);
int bench_command(const std::vector<std::string>& args);  // CUDA builds only
}
