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
//
// Several files (llm.c's shards: fineweb_train_000001.bin, ...) are one
// stream in their order, split into segments (TokenSegment: a file and a
// range of it). A window never crosses two segments: a training start is
// uniform over every segment's valid starts together, validation windows
// run through the segments in order. With one segment (one file, or the
// file's training split) every batch is what it was before segments existed.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

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

// A range of one token file.
struct TokenSegment {
  std::shared_ptr<const TokenFile> file;
  TokenRange range;
};

using TokenFiles = std::vector<std::shared_ptr<const TokenFile>>;

// Every path opened as a TokenFile (each validated). They must hold the same
// kind of tokens, one stream's shards: the same vocabulary, all llm.c's or
// all Loom's; throws naming the first file that differs, or when `paths` is
// empty.
TokenFiles open_token_files(const std::vector<std::string>& paths);

// `files` read as one stream in order, split as TokenFile splits one file:
// the last `validation_fraction` of all their tokens (rounded down) is the
// validation split, the rest the training split; a file the cut falls in is
// in both. Throws when `files` is empty or the fraction is outside [0, 1).
std::vector<TokenSegment> train_segments(const TokenFiles& files, double validation_fraction);
std::vector<TokenSegment> validation_segments(const TokenFiles& files, double validation_fraction);
// Every token of every file (a training or validation set of its own).
std::vector<TokenSegment> whole_segments(const TokenFiles& files);

// "a.bin" for one segment's file, "a.bin .. z.bin (N files)" for several.
std::string describe(const std::vector<TokenSegment>& segments);

// The rows of training step `step` for options.dp_rank, drawn from
// `segments` (or one file's `range`). A pure function of its arguments (no
// state, no thread).
TokenBatch sample_token_batch(const std::vector<TokenSegment>& segments,
                              const TokenLoaderOptions& options, int64_t step);
TokenBatch sample_token_batch(const TokenFile& file, TokenRange range,
                              const TokenLoaderOptions& options, int64_t step);

class TokenLoader {
 public:
  // Training windows from `file`'s training split (options.validation_fraction),
  // or from `segments`. Throws loom::Error if the options are invalid or no
  // segment holds a whole window.
  TokenLoader(std::shared_ptr<const TokenFile> file, const TokenLoaderOptions& options);
  TokenLoader(std::vector<TokenSegment> segments, const TokenLoaderOptions& options);

  // The next step's batch (first_step, first_step + 1, ...). Rethrows an
  // error raised while making it on the background thread.
  TokenBatch next();

  // The first segment's range (the training split of one file).
  TokenRange range() const { return segments_.front().range; }
  const std::vector<TokenSegment>& segments() const { return segments_; }
  const TokenLoaderOptions& options() const { return options_; }

 private:
  std::vector<TokenSegment> segments_;
  TokenLoaderOptions options_;
  int64_t next_step_;
  std::unique_ptr<TokenPrefetcher> prefetcher_;  // null with prefetch_depth 0
};

class TokenValidationBatches {
 public:
  // Windows of `file`'s validation split (options.validation_fraction), or of
  // `segments`. max_batches < 0: every full global batch.
  TokenValidationBatches(std::shared_ptr<const TokenFile> file, const TokenLoaderOptions& options,
                         int64_t max_batches = -1);
  TokenValidationBatches(std::vector<TokenSegment> segments, const TokenLoaderOptions& options,
                         int64_t max_batches = -1);

  // Number of batches one pass yields (the same on every rank).
  int64_t batches() const { return batches_; }
  // Fills `batch` with this rank's rows of the next global batch; false after the last.
  bool next(TokenBatch& batch);
  // Starts the pass over.
  void reset() { next_ = 0; }

 private:
  std::vector<TokenSegment> segments_;
  std::vector<int64_t> first_window_;  // of each segment, in the stream of windows
  TokenLoaderOptions options_;
  int64_t batches_ = 0;
  int64_t next_ = 0;
};

}  // namespace loom::data
