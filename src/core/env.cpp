#include "core/env.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <string>

#include "loom/core/error.hpp"

namespace loom::detail {

std::optional<bool> env_switch(const char* name) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return std::nullopt;
  std::string value(text);
  std::transform(value.begin(), value.end(), value.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (value == "1" || value == "on" || value == "true" || value == "yes") return true;
  if (value == "0" || value == "off" || value == "false" || value == "no") return false;
  throw Error(str_cat(name, "='", text,
                      "' must be 1, on, true or yes to switch it on, 0, off, false or no to "
                      "switch it off"));
}

std::optional<uint64_t> env_count(const char* name, uint64_t max, const char* meaning) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return std::nullopt;
  const std::string value(text);
  const bool digits = std::all_of(value.begin(), value.end(),
                                  [](unsigned char c) { return std::isdigit(c) != 0; });
  errno = 0;
  const unsigned long long number = digits ? std::strtoull(text, nullptr, 10) : 0;
  LOOM_CHECK(digits && errno == 0 && number <= max, name, "='", text, "' must be a whole number ",
             "from 0 to ", max, " (", meaning, ")");
  return number;
}

std::optional<std::string> env_choice(const char* name,
                                      std::initializer_list<const char*> choices) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return std::nullopt;
  std::string accepted;
  for (const char* choice : choices) {
    if (std::string(text) == choice) return std::string(text);
    accepted += (accepted.empty() ? "" : ", ") + std::string(choice);
  }
  throw Error(str_cat(name, "='", text, "' must be one of ", accepted));
}

}  // namespace loom::detail
