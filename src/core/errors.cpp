// The error every entry point throws, and the names of devices it uses in its messages.
#include <string>
#include <utility>

#include "snapmla/types.hpp"

namespace snapmla {

std::string to_string(Device d) {
  return d.is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(d.index);
}

Error::Error(std::string op, std::string argument, const std::string& what)
    : std::invalid_argument("snapmla::" + op + ": argument '" + argument + "': " + what),
      op_(std::move(op)),
      argument_(std::move(argument)) {}

}  // namespace snapmla
