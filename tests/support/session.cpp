// The skip record and the listener that follows test cases (support/session.hpp).
// Catch2 2.x exposes its listener base class only with external interfaces.
#define CATCH_CONFIG_EXTERNAL_INTERFACES
#include <catch2/catch.hpp>

#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include "session.hpp"
#include "skip.hpp"

namespace loom::test {

namespace {

struct Skip {
  std::string test_case;
  std::string reason;
};

struct Record {
  std::mutex mutex;
  std::string current;  // the running test case
  int run = 0;
  std::vector<Skip> skips;
};

Record& record() {
  static Record r;
  return r;
}

// Follows which test case runs, so that a skip knows whose it is.
class SkipListener : public Catch::TestEventListenerBase {
 public:
  using TestEventListenerBase::TestEventListenerBase;
  void testCaseStarting(const Catch::TestCaseInfo& info) override {
    std::lock_guard lock(record().mutex);
    record().current = info.name;
    ++record().run;
  }
};

CATCH_REGISTER_LISTENER(SkipListener)

}  // namespace

void record_skip(const std::string& reason) {
  std::lock_guard lock(record().mutex);
  Record& r = record();
  // A test case records at most one skip, however many sections skip.
  if (!r.skips.empty() && r.skips.back().test_case == r.current) return;
  r.skips.push_back({r.current, reason});
}

SessionOutcome outcome() {
  std::lock_guard lock(record().mutex);
  return {record().run, static_cast<int>(record().skips.size())};
}

int exit_status(int catch_status) {
  const SessionOutcome o = outcome();
  {
    std::lock_guard lock(record().mutex);
    for (const Skip& s : record().skips) {
      std::printf("SKIPPED: %s: %s\n", s.test_case.c_str(), s.reason.c_str());
    }
  }
  std::fflush(stdout);
  if (catch_status != 0) return catch_status;
  return o.test_cases_run > 0 && o.test_cases_skipped == o.test_cases_run ? kSkipExitCode : 0;
}

}  // namespace loom::test
