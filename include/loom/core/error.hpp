// Errors raised by Loom.
//
// Loom throws; it never calls exit(). Two kinds of failure are kept apart
// (see docs/errors.md):
//
//   loom::Error          the caller can act on it: invalid input (a shape, a
//                        layout, a dtype that breaks a rule), a library call
//                        that failed (CUDA, cuBLAS, cuDNN, NCCL, MPI), a peer
//                        that timed out. The message names the offending value
//                        and the rule it breaks.
//   loom::InternalError  a broken invariant inside Loom: a bug. Raised by
//                        LOOM_ASSERT with the condition, file and line.
//
// LOOM_CHECK(cond, parts...) throws loom::Error with the parts concatenated:
//
//   LOOM_CHECK(heads % tp == 0, "tensor parallel size ", tp, " does not divide ",
//              heads, " attention heads");
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace loom {

class Error : public std::runtime_error {
 public:
  // Also remembers the message as this thread's latest error (NOTE [failing
  // rank] in comm/context.cpp: a rank whose Context is destroyed by an
  // exception tells its peers why).
  explicit Error(const std::string& message);
};

// A call into a third-party library (CUDA, cuBLAS, cuDNN, NCCL, MPI) failed.
// what() reads: "<library> error <code> (<library's string>) in `<call>` at
// <file>:<line>". The parts are kept for callers that want to react to them.
class LibraryError : public Error {
 public:
  LibraryError(std::string library, long code, std::string library_message, std::string call,
               std::string file, int line);
  const std::string& library() const { return library_; }
  long code() const { return code_; }
  const std::string& library_message() const { return library_message_; }
  const std::string& call() const { return call_; }

 private:
  std::string library_;
  long code_;
  std::string library_message_;
  std::string call_;
};

class InternalError : public std::logic_error {
 public:
  explicit InternalError(const std::string& message) : std::logic_error(message) {}
};

// Concatenates its arguments with operator<<.
template <typename... Parts>
std::string str_cat(Parts&&... parts) {
  std::ostringstream out;
  (out << ... << std::forward<Parts>(parts));
  return out.str();
}

namespace detail {
[[noreturn]] void throw_internal_error(const char* condition, const char* file, int line,
                                       const std::string& message);
}  // namespace detail

}  // namespace loom

#define LOOM_CHECK(cond, ...)                            \
  do {                                                   \
    if (!(cond)) [[unlikely]] {                          \
      throw ::loom::Error(::loom::str_cat(__VA_ARGS__)); \
    }                                                    \
  } while (false)

#define LOOM_ASSERT(cond, ...)                                                              \
  do {                                                                                      \
    if (!(cond)) [[unlikely]] {                                                             \
      ::loom::detail::throw_internal_error(#cond, __FILE__, __LINE__,                       \
                                           ::loom::str_cat("" __VA_OPT__(, ) __VA_ARGS__)); \
    }                                                                                       \
  } while (false)
