// Bad input: the CLI turns this into exit status 2 with the message (which names the file,
// line and field). A leaf header: every layer may throw it.
#pragma once
#include <stdexcept>

namespace tandem {

class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace tandem
