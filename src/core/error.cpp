#include "loom/core/error.hpp"

#include "core/error_record.hpp"
#include "core/library_check.hpp"

namespace loom {

namespace {
thread_local std::string t_latest_error;
}  // namespace

Error::Error(const std::string& message) : std::runtime_error(message) {
  detail::note_error(message);
}

namespace detail {
void note_error(const std::string& message) {
  t_latest_error = message;
}
const std::string& latest_error_on_this_thread() {
  return t_latest_error;
}
}  // namespace detail

LibraryError::LibraryError(std::string library, long code, std::string library_message,
                           std::string call, std::string file, int line)
    : Error(str_cat(library, " error ", code, " (", library_message, ") in `", call, "` at ", file,
                    ":", line)),
      library_(std::move(library)),
      code_(code),
      library_message_(std::move(library_message)),
      call_(std::move(call)) {}

namespace detail {

void throw_internal_error(const char* condition, const char* file, int line,
                          const std::string& message) {
  throw InternalError(str_cat("Loom internal error: assertion `", condition, "` failed at ", file,
                              ":", line, message.empty() ? "" : ": ", message,
                              " (this is a bug in Loom; please report it)"));
}

void throw_library_error(const char* library, long code, const std::string& library_message,
                         const char* call, const char* file, int line) {
  throw LibraryError(library, code, library_message, call, file, line);
}

}  // namespace detail
}  // namespace loom
