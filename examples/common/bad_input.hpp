// Input a run refuses (a flag, a layout the world cannot take, a checkpoint
// of another run) ends the examples with exit status 2; a failure while
// running with 1. So a supervisor knows what running again cannot fix:
// loom-restart does not restart a job that exits 2 (docs/checkpoint.md).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdio>
#include <stdexcept>

#include "loom/core/error.hpp"

namespace loom::examples {

inline constexpr int kBadInputStatus = 2;

struct BadInput : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Runs `check`; a loom::Error it throws becomes a BadInput with its message.
template <class Check>
void refuse_bad_input(Check&& check) {
  try {
    check();
  } catch (const loom::Error& e) {
    throw BadInput(e.what());
  }
}

// main()'s end in the examples: the flags parsed (refused: status 2; --help:
// 0), then `run()`, whose status it returns; what escapes it is printed
// after the program's name, with status 2 for BadInput and 1 otherwise.
template <class Run>
int main_with_status(const char* name, CLI::App& app, int argc, char** argv, Run&& run) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kBadInputStatus;
  }
  try {
    return run();
  } catch (const BadInput& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return kBadInputStatus;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return 1;
  }
}

}  // namespace loom::examples
