// merge_chrome_traces on synthetic rank files: one process per rank, times
// shifted by the clock origins, and errors for duplicate ranks and bad files.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>

#include "loom/trace/chrome_trace.hpp"

using Catch::Matchers::Contains;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::string write_rank_file(const char* name, int rank, int64_t system_ns, double ts) {
  const fs::path path = fs::temp_directory_path() / name;
  const json trace{
      {"traceEvents",
       {{{"name", "linear.forward"},
         {"ph", "X"},
         {"pid", rank},
         {"tid", 1},
         {"ts", ts},
         {"dur", 5.0}},
        {{"name", "process_name"},
         {"ph", "M"},
         {"pid", rank},
         {"tid", 0},
         {"args", {{"name", "rank " + std::to_string(rank)}}}}}},
      {"loom", {{"rank", rank}, {"clock_origin", {{"steady_ns", 7}, {"system_ns", system_ns}}}}}};
  std::ofstream(path) << trace.dump();
  return path.string();
}

}  // namespace

TEST_CASE("merging two rank traces aligns their clocks by the recorded origins", "[trace]") {
  // Rank 1 started profiling 2 ms (2,000,000 ns) after rank 0.
  const std::string r0 = write_rank_file("loom_merge_test_r0.json", 0, 1'000'000'000, 100.0);
  const std::string r1 = write_rank_file("loom_merge_test_r1.json", 1, 1'002'000'000, 100.0);
  const fs::path out = fs::temp_directory_path() / "loom_merge_test_out.json";
  loom::trace::merge_chrome_traces(out.string(), {r1, r0});

  std::ifstream in(out);
  const json merged = json::parse(in);
  int ops = 0;
  for (const auto& e : merged["traceEvents"]) {
    if (e["ph"] != "X") continue;
    ++ops;
    // Both ops ran 100 us after their own origin: rank 1's lands 2000 us later.
    CHECK(e["ts"].get<double>() == (e["pid"] == 1 ? 2100.0 : 100.0));
  }
  CHECK(ops == 2);
  CHECK(merged["loom"]["clock_origin"]["system_ns"] == 1'000'000'000);
  CHECK(merged["loom"]["merged"].size() == 2);

  CHECK_THROWS_WITH(loom::trace::merge_chrome_traces(out.string(), {r0, r0}),
                    Contains("rank 0, which an earlier input already is"));
  const fs::path bad = fs::temp_directory_path() / "loom_merge_test_bad.json";
  std::ofstream(bad) << "{\"traceEvents\": [";
  CHECK_THROWS_WITH(loom::trace::merge_chrome_traces(out.string(), {bad.string()}),
                    Contains("is not valid JSON"));
  std::ofstream(bad) << "{\"traceEvents\": []}";
  CHECK_THROWS_WITH(loom::trace::merge_chrome_traces(out.string(), {bad.string()}),
                    Contains("is not a Loom rank trace"));
  for (const fs::path& p : {fs::path(r0), fs::path(r1), out, bad}) fs::remove(p);
}
