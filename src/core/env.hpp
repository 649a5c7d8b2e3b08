// Internal: environment variables read by Loom, validated where they are read.
//
// A variable that is set to a value Loom cannot use throws loom::Error naming
// the variable, the value and what it accepts; unset or empty means "not set".
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>

namespace loom::detail {

// An on/off switch: 1, on, true, yes / 0, off, false, no (any case).
std::optional<bool> env_switch(const char* name);

// A whole number in [0, max] (digits only: no sign, no unit). `meaning` ends
// the message ("a number of MiB").
std::optional<uint64_t> env_count(const char* name, uint64_t max, const char* meaning);

// One of `choices`, spelled exactly (lower case).
std::optional<std::string> env_choice(const char* name, std::initializer_list<const char*> choices);

}  // namespace loom::detail
