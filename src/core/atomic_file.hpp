// Internal: files that exist whole or not at all.
//
// NOTE [atomic files]
// Whatever Loom writes for someone else to read later (token files, traces,
// checkpoint shards and manifests) is written to a fresh temporary file beside
// the target (same folder, so the rename cannot cross file systems), flushed
// to disk with fsync, and renamed over the target; then the folder is fsynced
// so that the rename itself survives a crash. A reader therefore sees the
// previous file or the complete new one, never a prefix, even if the writer
// dies at any moment. On any error the temporary file is removed and the error
// rethrown, naming the file and the failing call.
#pragma once

#include <cstddef>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>

namespace loom::detail {

// Where the writer callback puts the file's bytes.
class FileSink {
 public:
  FileSink(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  // Writes all `bytes` (retrying short writes); throws loom::Error naming the file.
  void write(const void* data, size_t bytes);
  void write(std::string_view text) { write(text.data(), text.size()); }
  size_t bytes_written() const { return written_; }

 private:
  int fd_;
  std::string path_;  // the temporary file, for messages
  size_t written_ = 0;
};

// Writes `path` atomically and durably (NOTE [atomic files]); `write` produces
// the content. `what` names the kind of file in error messages ("token file").
void write_file_atomically(const std::filesystem::path& path, std::string_view what,
                           const std::function<void(FileSink&)>& write);

inline void write_file_atomically(const std::filesystem::path& path, std::string_view what,
                                  std::string_view content) {
  write_file_atomically(path, what, [&](FileSink& sink) { sink.write(content); });
}

}  // namespace loom::detail
