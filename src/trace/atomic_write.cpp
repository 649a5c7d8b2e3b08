#include "trace/atomic_write.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "loom/core/error.hpp"

namespace loom::trace::detail {

void write_file_atomically(const std::string& path, const std::string& content) {
  // The process id keeps two writers of one path from sharing a temporary file.
  const std::string temporary = str_cat(path, ".tmp.", ::getpid());
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    LOOM_CHECK(out.good(), "cannot open '", temporary, "' for writing: ", std::strerror(errno));
    out << content;
    out.flush();
    LOOM_CHECK(out.good(), "writing '", temporary, "' failed: ", std::strerror(errno));
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    const int error = errno;
    std::remove(temporary.c_str());
    LOOM_CHECK(false, "cannot rename '", temporary, "' to '", path, "': ", std::strerror(error));
  }
}

}  // namespace loom::trace::detail
