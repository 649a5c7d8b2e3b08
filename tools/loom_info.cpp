// loom-info: prints how Loom was built and which devices it can use.
#include <cstdio>

#include "loom/core/build_info.hpp"

int main() {
  std::fputs(loom::build_summary().c_str(), stdout);
  return 0;
}
