#include <catch2/catch.hpp>

#include "core/mpi_check.hpp"
#include "loom/core/error.hpp"

using Catch::Matchers::Contains;

TEST_CASE("LOOM_CHECK throws loom::Error with the parts of the message") {
  const int tp = 3, heads = 8;
  try {
    LOOM_CHECK(heads % tp == 0, "tensor parallel size ", tp, " does not divide ", heads,
               " attention heads");
    FAIL("no exception");
  } catch (const loom::Error& e) {
    CHECK(std::string(e.what()) == "tensor parallel size 3 does not divide 8 attention heads");
  }
  CHECK_NOTHROW([] { LOOM_CHECK(1 + 1 == 2, "unused"); }());
}

TEST_CASE("LOOM_ASSERT raises InternalError naming the condition and location") {
  try {
    LOOM_ASSERT(2 < 1, "value was ", 42);
    FAIL("no exception");
  } catch (const loom::InternalError& e) {
    CHECK_THAT(e.what(), Contains("`2 < 1`") && Contains("error_test.cpp") &&
                             Contains("value was 42") && Contains("bug in Loom"));
  }
}

TEST_CASE("LOOM_MPI_CHECK records the call, the MPI error string, file and line") {
  auto failing_call = [] { return MPI_ERR_COUNT; };
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    // Before MPI_Init there is no error string, but the check must not abort the process.
    CHECK_THROWS_WITH([&] { LOOM_MPI_CHECK(failing_call()); }(),
                      Contains("MPI is not initialized"));
    int provided = 0;
    REQUIRE(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided) == MPI_SUCCESS);
  }
  try {
    LOOM_MPI_CHECK(failing_call());
    FAIL("no exception");
  } catch (const loom::LibraryError& e) {
    CHECK(e.library() == "MPI");
    CHECK(e.code() == MPI_ERR_COUNT);
    CHECK(e.call() == "failing_call()");
    CHECK_THAT(e.what(), Contains("MPI error") && Contains("`failing_call()`") &&
                             Contains("error_test.cpp:"));
    CHECK_THAT(e.library_message(), Contains("count"));
  }
  CHECK_NOTHROW([] { LOOM_MPI_CHECK(MPI_SUCCESS); }());
  if (!initialized) MPI_Finalize();
}
