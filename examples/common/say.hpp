// printf on the lead rank only (the examples' progress lines), with the
// format checked against its arguments by the compiler.
#pragma once

#include <cstdarg>
#include <cstdio>

namespace loom::examples {

[[gnu::format(printf, 2, 3)]] inline void say_on(bool lead, const char* format, ...) {
  if (!lead) return;
  va_list args;
  va_start(args, format);
  std::vprintf(format, args);
  va_end(args);
}

}  // namespace loom::examples
