// loom-trace-merge: merges per-rank Chrome traces (Profiler::write_chrome_trace)
// into one file with one process per rank, clocks aligned by each file's
// recorded clock origin. Open the result in https://ui.perfetto.dev.
//
//   loom-trace-merge merged.json trace_rank0.json trace_rank1.json ...
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/trace/chrome_trace.hpp"

int main(int argc, char** argv) {
  CLI::App app{"Merge per-rank Loom Chrome traces into one timeline"};
  std::string output;
  std::vector<std::string> inputs;
  app.add_option("output", output, "merged trace to write")->required();
  app.add_option("inputs", inputs, "per-rank trace files")->required();
  CLI11_PARSE(app, argc, argv);
  try {
    loom::trace::merge_chrome_traces(output, inputs);
  } catch (const loom::Error& e) {
    std::fprintf(stderr, "loom-trace-merge: %s\n", e.what());
    return 1;
  }
  std::printf("merged %zu rank trace(s) into %s\n", inputs.size(), output.c_str());
  return 0;
}
