// Training and validation windows (the rules are in token_loader.hpp).
#include "loom/data/token_loader.hpp"

#include <algorithm>
#include <cmath>
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

int64_t total_tokens(const std::vector<TokenSegment>& segments) {
  int64_t total = 0;
  for (const TokenSegment& s : segments) total += s.range.size();
  return total;
}

// Each segment's valid training starts (a window is seq_len + 1 tokens),
// summed before it: first[i] .. first[i + 1] - 1 are segment i's. Throws
// naming the split when no segment holds a whole window.
std::vector<int64_t> window_prefix(const std::vector<TokenSegment>& segments, int64_t per_window,
                                   int64_t stride, const TokenLoaderOptions& o, const char* split) {
  LOOM_CHECK(!segments.empty(), "token loader: no token files for the ", split, " split");
  std::vector<int64_t> first{0};
  for (const TokenSegment& s : segments) {
    LOOM_CHECK(s.file != nullptr, "token loader: a ", split, " segment has no token file");
    LOOM_CHECK(s.range.begin >= 0 && s.range.begin <= s.range.end && s.range.end <= s.file->size(),
               "token loader: range [", s.range.begin, ", ", s.range.end, ") is outside the ",
               s.file->size(), " tokens of ", s.file->path());
    const int64_t windows =
        s.range.size() >= per_window ? (s.range.size() - per_window) / stride + 1 : 0;
    first.push_back(first.back() + windows);
  }
  LOOM_CHECK(first.back() >= 1, "token loader: the ", split, " split of ", describe(segments),
             " has ", total_tokens(segments), " tokens",
             segments.size() > 1 ? " (none of its files holds" : ",",
             segments.size() > 1 ? " one window" : " fewer than one window",
             " of seq_len + 1 = ", o.seq_len + 1, segments.size() > 1 ? ")" : "");
  return first;
}

// The segment holding position `index` of the stream `first` numbers.
size_t segment_of(const std::vector<int64_t>& first, int64_t index) {
  return static_cast<size_t>(std::upper_bound(first.begin(), first.end(), index) - first.begin() -
                             1);
}

std::vector<TokenSegment> split(const TokenFiles& files, double fraction, bool validation) {
  LOOM_CHECK(!files.empty(), "token files: none given");
  LOOM_CHECK(fraction >= 0.0 && fraction < 1.0, "token files ",
             files.front() ? files.front()->path() : std::string("?"), ": validation fraction ",
             fraction, " must be in [0, 1)");
  int64_t total = 0;
  for (const auto& f : files) {
    LOOM_CHECK(f != nullptr, "token files: a file is missing");
    total += f->size();
  }
  // As TokenFile::validation_range, over the whole stream.
  const int64_t cut = total - static_cast<int64_t>(std::floor(fraction * double(total)));
  std::vector<TokenSegment> out;
  int64_t offset = 0;
  for (const auto& f : files) {
    const int64_t begin = validation ? std::max<int64_t>(cut - offset, 0) : 0;
    const int64_t end = validation ? f->size() : std::min(cut - offset, f->size());
    // Files wholly on the other side of the cut are left out (but for one,
    // empty, when every file is: the split's error then names it).
    if (end > begin || (out.empty() && &f == &files.back())) {
      out.push_back({f, {begin, std::max(begin, end)}});
    }
    offset += f->size();
  }
  return out;
}

// One file's training or validation split, as one segment.
std::vector<TokenSegment> one_file(std::shared_ptr<const TokenFile> file, double fraction,
                                   bool validation, const char* who) {
  LOOM_CHECK(file != nullptr, who, ": no token file");
  const TokenRange range =
      validation ? file->validation_range(fraction) : file->train_range(fraction);
  return {{std::move(file), range}};
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

TokenFiles open_token_files(const std::vector<std::string>& paths) {
  LOOM_CHECK(!paths.empty(), "token files: none given");
  TokenFiles files;
  for (const std::string& path : paths) {
    files.push_back(std::make_shared<const TokenFile>(path));
    const TokenFile& first = *files.front();
    const TokenFile& file = *files.back();
    LOOM_CHECK(file.vocab_size() == first.vocab_size() && file.from_llmc() == first.from_llmc(),
               "token files: ", file.path(), " holds ", file.vocab_size(), "-id tokens (",
               file.from_llmc() ? "llm.c's" : "Loom's", " format) where ", first.path(), " holds ",
               first.vocab_size(), "-id tokens (", first.from_llmc() ? "llm.c's" : "Loom's",
               "): the files of one stream must hold the same kind of tokens");
  }
  return files;
}

std::vector<TokenSegment> train_segments(const TokenFiles& files, double validation_fraction) {
  return split(files, validation_fraction, false);
}

std::vector<TokenSegment> validation_segments(const TokenFiles& files, double validation_fraction) {
  return split(files, validation_fraction, true);
}

std::vector<TokenSegment> whole_segments(const TokenFiles& files) {
  return split(files, 0.0, false);
}

std::string describe(const std::vector<TokenSegment>& segments) {
  if (segments.empty()) return "no files";
  const std::string& first = segments.front().file->path();
  const std::string& last = segments.back().file->path();
  if (first == last) return first;
  return str_cat(first, " .. ", last, " (", segments.size(), " files)");
}

TokenBatch sample_token_batch(const TokenFile& file, TokenRange range, const TokenLoaderOptions& o,
                              int64_t step) {
  // A segment that does not own its file: the caller keeps it alive.
  const std::shared_ptr<const TokenFile> borrowed(std::shared_ptr<const TokenFile>{}, &file);
  return sample_token_batch(std::vector<TokenSegment>{{borrowed, range}}, o, step);
}

TokenBatch sample_token_batch(const std::vector<TokenSegment>& segments,
                              const TokenLoaderOptions& o, int64_t step) {
  check_options(o);
  // Valid window starts: seq_len + 1 tokens from each, one position apart.
  const std::vector<int64_t> first = window_prefix(segments, o.seq_len + 1, 1, o, "sampled");
  const auto starts = static_cast<uint64_t>(first.back());
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
    const auto index = static_cast<int64_t>(bits % starts);
    const size_t s_index = segment_of(first, index);
    const TokenSegment& segment = segments[s_index];
    const int64_t start = segment.range.begin + (index - first[s_index]);
    copy_window(segment.file->tokens(), start, row, o.seq_len, inputs, targets);
  }
  return b;
}

TokenLoader::TokenLoader(std::shared_ptr<const TokenFile> file, const TokenLoaderOptions& options)
    : TokenLoader(one_file(std::move(file), options.validation_fraction, false, "token loader"),
                  options) {}

TokenLoader::TokenLoader(std::vector<TokenSegment> segments, const TokenLoaderOptions& options)
    : segments_(std::move(segments)), options_(options), next_step_(options.first_step) {
  check_options(options_);
  window_prefix(segments_, options_.seq_len + 1, 1, options_, "training");
  if (options_.prefetch_depth > 0) {
    // The producer holds its own references to the files and a copy of the options.
    prefetcher_ = std::make_unique<TokenPrefetcher>(
        [segments = segments_, o = options_](int64_t step) {
          return sample_token_batch(segments, o, step);
        },
        options_.first_step, options_.prefetch_depth);
  }
}

TokenBatch TokenLoader::next() {
  const int64_t step = next_step_++;
  if (prefetcher_) return prefetcher_->next();
  return sample_token_batch(segments_, options_, step);
}

TokenValidationBatches::TokenValidationBatches(std::shared_ptr<const TokenFile> file,
                                               const TokenLoaderOptions& options,
                                               int64_t max_batches)
    : TokenValidationBatches(
          one_file(std::move(file), options.validation_fraction, true, "token validation batches"),
          options, max_batches) {}

TokenValidationBatches::TokenValidationBatches(std::vector<TokenSegment> segments,
                                               const TokenLoaderOptions& options,
                                               int64_t max_batches)
    : segments_(std::move(segments)), options_(options) {
  check_options(options_);
  // Consecutive windows of seq_len + 1 tokens, seq_len apart (each target
  // row's last token is the next input row's first).
  first_window_ =
      window_prefix(segments_, options_.seq_len + 1, options_.seq_len, options_, "validation");
  batches_ = first_window_.back() / (options_.batch * options_.dp_size);
  if (max_batches >= 0 && max_batches < batches_) batches_ = max_batches;
}

bool TokenValidationBatches::next(TokenBatch& batch) {
  if (next_ >= batches_) return false;
  const TokenLoaderOptions& o = options_;
  batch = empty_batch(next_, o.batch, o.seq_len);
  const int64_t first_window = (next_ * o.dp_size + o.dp_rank) * o.batch;
  for (int64_t row = 0; row < o.batch; ++row) {
    const int64_t window = first_window + row;
    const size_t s = segment_of(first_window_, window);
    const TokenSegment& segment = segments_[s];
    const int64_t start = segment.range.begin + (window - first_window_[s]) * o.seq_len;
    copy_window(segment.file->tokens(), start, row, o.seq_len, batch.inputs.data<int32_t>(),
                batch.targets.data<int32_t>());
  }
  ++next_;
  return true;
}

}  // namespace loom::data
