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

int accuracy_command(const std::vector<std::string>& args);
int bench_command(const std::vector<std::string>& args);  // CUDA builds only
}
