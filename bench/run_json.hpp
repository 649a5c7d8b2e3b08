// Runs a helper process (an mpirun'd benchmark worker, a PyTorch peer) and
// reads the JSON object it prints on its last non-empty line.
#pragma once

#include <array>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>

namespace loom::bench {

// Runs `command` (stderr merged into stdout); returns the JSON object on its
// last non-empty output line, or nullopt with `why` saying what went wrong
// (with the command's output).
inline std::optional<nlohmann::json> run_json(const std::string& command, std::string& why) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) {
    why = "cannot start '" + command + "'";
    return std::nullopt;
  }
  std::string output;
  std::array<char, 4096> chunk;
  while (fgets(chunk.data(), chunk.size(), pipe) != nullptr) output += chunk.data();
  const int status = pclose(pipe);
  std::string last_line;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty()) last_line = line;
  }
  if (status != 0) {
    why = "'" + command + "' failed:\n" + output;
    return std::nullopt;
  }
  try {
    return nlohmann::json::parse(last_line);
  } catch (const nlohmann::json::exception&) {
    why = "'" + command + "' did not end with a JSON line:\n" + output;
    return std::nullopt;
  }
}

}  // namespace loom::bench
