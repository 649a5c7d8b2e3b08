// Training and validation windows (the rules are in token_loader.hpp).
#include "loom/data/token_loader.hpp"

#include <utility>

#include "loom/core/error.hpp"
#include "loom/core/philox.hpp"

namespace loom::data {
namespace {

// Separates the loader's Philox draws from every other user of one seed.
constexpr uint32_t kWindowStream = 0x544f4b4eu;  // "TOKN"

void check_options(const TokenLoaderOptions& o) {
  LOOM_CHECK(o.batch >= 1, "token loader: batch ", o.batch, " must be at least 1");
  LOOM_CHECK(o.seq_len >= 1, "token loader: seq_len ", o.seq_len, " must be at least 1");
  LOOM_CHECK(o.dp_size >= 1 && o.dp_rank >= 0 && o.dp_rank < o.dp_size, "token loader: dp_rank ",
             o.dp_rank, " must be in [0, dp_size = ", o.dp_size, ")");
  LOOM_CHECK(o.prefetch_depth >= 0, "token loader: prefetch depth ", o.prefetch_depth,
             " must not be negative");
}

void check_fits(const TokenFile& file, TokenRange range, const TokenLoaderOptions& o,
                const char* split) {
  LOOM_CHECK(range.size() >= o.seq_len + 1, "token loader: the ", split, " split of ", file.path(),
             " has ", range.size(),
             " tokens, fewer than one window of seq_len + 1 = ", o.seq_len + 1);
}

// Writes window `start` into row `row` of inputs and targets.
void copy_window(std::span<const uint16_t> tokens, int64_t start, int64_t row, int64_t seq_len,
                 int32_t* inputs, int32_t* targets) {
  const uint16_t* window = tokens.data() + start;
  int32_t* in = inputs + row * seq_len;
  int32_t* out = targets + row * seq_len;
  for (int64_t t = 0; t < seq_len; ++t) {
    in[t] = window[t];
    out[t] = window[t + 1];
  }
}

TokenBatch empty_batch(int64_t step, int64_t rows, int64_t seq_len) {
  TokenBatch b;
  b.step = step;
  b.inputs = Tensor::empty({rows, seq_len}, DType::i32);
  b.targets = Tensor::empty({rows, seq_len}, DType::i32);
  return b;
}

}  // namespace

TokenBatch sample_token_batch(const TokenFile& file, TokenRange range, const TokenLoaderOptions& o,
                              int64_t step) {
  check_options(o);
  check_fits(file, range, o, "sampled");
  const std::span<const uint16_t> tokens = file.tokens();
  LOOM_CHECK(range.begin >= 0 && range.end <= file.size(), "token loader: range [", range.begin,
             ", ", range.end, ") is outside the ", file.size(), " tokens of ", file.path());
  const auto starts = static_cast<uint64_t>(range.size() - o.seq_len);  // valid window starts
  TokenBatch b = empty_batch(step, o.batch, o.seq_len);
  int32_t* inputs = b.inputs.data<int32_t>();
  int32_t* targets = b.targets.data<int32_t>();
  const auto s = static_cast<uint64_t>(step);
  for (int64_t row = 0; row < o.batch; ++row) {
    const auto window = static_cast<uint64_t>(o.dp_rank * o.batch + row);  // in the global batch
    const Philox4x32Result r = philox4x32(
        static_cast<uint32_t>(s), static_cast<uint32_t>(s >> 32), static_cast<uint32_t>(window),
        static_cast<uint32_t>(window >> 32), static_cast<uint32_t>(o.seed),
        static_cast<uint32_t>(o.seed >> 32) ^ kWindowStream);
    // 64 random bits modulo at most 2^40 starts: the bias is below 2^-24.
    const uint64_t bits = (uint64_t{r.v[0]} << 32) | r.v[1];
    const int64_t start = range.begin + static_cast<int64_t>(bits % starts);
    copy_window(tokens, start, row, o.seq_len, inputs, targets);
  }
  return b;
}

TokenLoader::TokenLoader(std::shared_ptr<const TokenFile> file, const TokenLoaderOptions& options)
    : file_(std::move(file)), options_(options), next_step_(options.first_step) {
  LOOM_CHECK(file_ != nullptr, "token loader: no token file");
  check_options(options_);
  range_ = file_->train_range(options_.validation_fraction);
  check_fits(*file_, range_, options_, "training");
  if (options_.prefetch_depth > 0) {
    // The producer holds its own reference to the file and a copy of the options.
    prefetcher_ = std::make_unique<TokenPrefetcher>(
        [file = file_, range = range_, o = options_](int64_t step) {
          return sample_token_batch(*file, range, o, step);
        },
        options_.first_step, options_.prefetch_depth);
  }
}

TokenBatch TokenLoader::next() {
  const int64_t step = next_step_++;
  if (prefetcher_) return prefetcher_->next();
  return sample_token_batch(*file_, range_, options_, step);
}

TokenValidationBatches::TokenValidationBatches(std::shared_ptr<const TokenFile> file,
                                               const TokenLoaderOptions& options,
                                               int64_t max_batches)
    : file_(std::move(file)), options_(options) {
  LOOM_CHECK(file_ != nullptr, "token validation batches: no token file");
  check_options(options_);
  range_ = file_->validation_range(options_.validation_fraction);
  check_fits(*file_, range_, options_, "validation");
  const int64_t windows = (range_.size() - 1) / options_.seq_len;
  batches_ = windows / (options_.batch * options_.dp_size);
  if (max_batches >= 0 && max_batches < batches_) batches_ = max_batches;
}

bool TokenValidationBatches::next(TokenBatch& batch) {
  if (next_ >= batches_) return false;
  const TokenLoaderOptions& o = options_;
  batch = empty_batch(next_, o.batch, o.seq_len);
  const int64_t first_window = (next_ * o.dp_size + o.dp_rank) * o.batch;
  for (int64_t row = 0; row < o.batch; ++row) {
    const int64_t start = range_.begin + (first_window + row) * o.seq_len;
    copy_window(file_->tokens(), start, row, o.seq_len, batch.inputs.data<int32_t>(),
                batch.targets.data<int32_t>());
  }
  ++next_;
  return true;
}

}  // namespace loom::data
