// Internal: write a file so that readers see the old content or the whole new
// content, never a partial file (temporary file in the same folder, then rename).
#pragma once

#include <string>

namespace loom::trace::detail {

void write_file_atomically(const std::string& path, const std::string& content);

}  // namespace loom::trace::detail
