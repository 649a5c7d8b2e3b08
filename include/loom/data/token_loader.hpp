// Language-model batches from a token file: random training windows and
// sequential validation windows, sharded over data-parallel ranks.
//
// A window is seq_len + 1 consecutive tokens; inputs are its first seq_len,
// targets its last seq_len (inputs shifted by one). Both are [B, T] i32 on
// the host.
//
// Training (TokenLoader): step s has a *global* batch of batch * dp_size
// windows. Window j's start is a pure function of (seed, s, j) (Philox), uniform
// over the training split's valid starts. Rank r takes rows [r * batch,
// (r + 1) * batch) of the global batch, so a single-rank run with batch *
// dp_size rows sees exactly the concatenation of the ranks' batches: data
// parallelism changes who computes a row, never which rows a step has. A run
// that resumes at step s (first_step) sees the batches it would have seen.
//
// Validation (TokenValidationBatches): the validation split cut into
// consecutive non-overlapping windows, grouped into global batches the same
// way; the windows that do not fill a whole global batch are left out, so
// every rank gets the same number of full batches.
#pragma once

#include <cstdint>
#include <memory>

#include "loom/data/token_file.hpp"
#include "loom/data/token_prefetcher.hpp"

namespace loom::data {

struct TokenLoaderOptions {
  int64_t batch = 8;  // rows per rank per step
  int64_t seq_len = 128;
  uint64_t seed = 0;
  int dp_rank = 0;
  int dp_size = 1;
  double validation_fraction = 0.05;  // see TokenFile::validation_range
  int64_t first_step = 0;             // the first next() returns this step's batch
  int prefetch_depth = 2;             // batches made ahead on a background thread; 0: none
};

// The rows of training step `step` for options.dp_rank, drawn from `range`.
// A pure function of its arguments (no state, no thread).
TokenBatch sample_token_batch(const TokenFile& file, TokenRange range,
                              const TokenLoaderOptions& options, int64_t step);

class TokenLoader {
 public:
  // Throws loom::Error if the options are invalid or the training split is
  // shorter than one window.
  TokenLoader(std::shared_ptr<const TokenFile> file, const TokenLoaderOptions& options);

  // The next step's batch (first_step, first_step + 1, ...). Rethrows an
  // error raised while making it on the background thread.
  TokenBatch next();

  TokenRange range() const { return range_; }
  const TokenLoaderOptions& options() const { return options_; }

 private:
  std::shared_ptr<const TokenFile> file_;
  TokenLoaderOptions options_;
  TokenRange range_;
  int64_t next_step_;
  std::unique_ptr<TokenPrefetcher> prefetcher_;  // null with prefetch_depth 0
};

class TokenValidationBatches {
 public:
  // max_batches < 0: every full global batch of the validation split.
  TokenValidationBatches(std::shared_ptr<const TokenFile> file, const TokenLoaderOptions& options,
                         int64_t max_batches = -1);

  // Number of batches one pass yields (the same on every rank).
  int64_t batches() const { return batches_; }
  // Fills `batch` with this rank's rows of the next global batch; false after the last.
  bool next(TokenBatch& batch);
  // Starts the pass over.
  void reset() { next_ = 0; }

 private:
  std::shared_ptr<const TokenFile> file_;
  TokenLoaderOptions options_;
  TokenRange range_;
  int64_t batches_ = 0;
  int64_t next_ = 0;
};

}  // namespace loom::data
