// Runs a helper process (an mpirun'd benchmark worker, a PyTorch peer) and
// reads the JSON object it prints last.
#pragma once

#include <array>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace loom::bench {

// Runs `command` (stderr merged into stdout); returns the last output line
// that is a JSON object, or nullopt with `why` saying what went wrong (with
// the command's output). Lines after it are ignored: under mpirun another
// rank's late warning can follow rank 0's result.
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
  if (status != 0) {
    why = "'" + command + "' failed:\n" + output;
    return std::nullopt;
  }
  std::vector<std::string> lines;
  std::istringstream stream(output);
  for (std::string line; std::getline(stream, line);) lines.push_back(line);
  for (auto line = lines.rbegin(); line != lines.rend(); ++line) {
    if (line->empty() || line->front() != '{') continue;
    try {
      nlohmann::json value = nlohmann::json::parse(*line);
      if (value.is_object()) return value;
    } catch (const nlohmann::json::exception&) {
      // not a result line: keep looking
    }
  }
  why = "'" + command + "' printed no JSON line:\n" + output;
  return std::nullopt;
}

}  // namespace loom::bench
