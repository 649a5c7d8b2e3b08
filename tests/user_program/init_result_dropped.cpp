// Misuse that must not compile silently: dropping loom::init()'s Context shuts
// the backend down again at the end of the statement. The test compiles this
// file and expects the [[nodiscard]] warning with its reason.
#include <loom/comm/context.hpp>

int main() {
  loom::init();
  return 0;
}
