#include "core/atomic_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "loom/core/error.hpp"

namespace loom::detail {
namespace {

std::string errno_text() {
  return std::strerror(errno);
}

// Closes a file descriptor on scope exit.
struct FileDescriptor {
  int fd = -1;
  ~FileDescriptor() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

void FileSink::write(const void* data, size_t bytes) {
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    LOOM_CHECK(n > 0, "writing ", path_, " failed: ", errno_text());
    p += n;
    bytes -= static_cast<size_t>(n);
    written_ += static_cast<size_t>(n);
  }
}

void write_file_atomically(const std::filesystem::path& path, std::string_view what,
                           const std::function<void(FileSink&)>& write) {
  const std::filesystem::path dir =
      path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  // The process id and a random number keep concurrent writers of one path
  // (two ranks, two threads) from sharing a temporary file.
  std::random_device entropy;
  const std::filesystem::path temp =
      dir / str_cat(path.filename().string(), ".tmp.", ::getpid(), ".", entropy());
  FileDescriptor file{::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644)};
  LOOM_CHECK(file.fd >= 0, what, " ", path.string(), ": cannot create temporary file ",
             temp.string(), ": ", errno_text());
  try {
    FileSink sink(file.fd, temp.string());
    write(sink);
    LOOM_CHECK(::fsync(file.fd) == 0, what, " ", path.string(), ": fsync of ", temp.string(),
               " failed: ", errno_text());
    const int fd = file.fd;
    file.fd = -1;
    LOOM_CHECK(::close(fd) == 0, what, " ", path.string(), ": close of ", temp.string(),
               " failed: ", errno_text());
    LOOM_CHECK(::rename(temp.c_str(), path.c_str()) == 0, what, " ", path.string(),
               ": rename from ", temp.string(), " failed: ", errno_text());
  } catch (...) {
    ::unlink(temp.c_str());
    throw;
  }
  // Make the rename itself durable. (Some file systems refuse fsync on a folder;
  // the file's own data is already on disk, so that is not an error.)
  FileDescriptor directory{::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (directory.fd >= 0) ::fsync(directory.fd);
}

}  // namespace loom::detail
