// train_gpt's tokens: the training files (--token-file, one file or a glob
// of llm.c's shards) and where validation comes from (--val-token-file, or
// the last 5% of the training stream).
#pragma once

#include <string>
#include <vector>

#include "loom/core/error.hpp"
#include "loom/data/token_file.hpp"
#include "loom/data/token_loader.hpp"

namespace loom::examples {

struct TokenData {
  data::TokenFiles files;             // --token-file's, in order
  data::TokenFiles validation_files;  // --val-token-file's; empty without it
  std::vector<data::TokenSegment> train, validation;
};

// Opens the training files and, where `validation_pattern` is given, its
// files, which must hold the training files' kind of tokens. Without it the
// validation split is the training stream's last
// TokenLoaderOptions::validation_fraction.
inline TokenData open_token_data(const std::vector<std::string>& train_paths,
                                 const std::string& validation_pattern) {
  TokenData d;
  d.files = data::open_token_files(train_paths);
  if (validation_pattern.empty()) {
    const double fraction = data::TokenLoaderOptions{}.validation_fraction;
    d.train = data::train_segments(d.files, fraction);
    d.validation = data::validation_segments(d.files, fraction);
    return d;
  }
  d.validation_files = data::open_token_files(data::token_file_paths(validation_pattern));
  const data::TokenFile& train = *d.files.front();
  const data::TokenFile& validation = *d.validation_files.front();
  LOOM_CHECK(
      validation.vocab_size() == train.vocab_size() && validation.from_llmc() == train.from_llmc(),
      "--val-token-file ", validation.path(), " holds ", validation.vocab_size(),
      "-id tokens where --token-file ", train.path(), " holds ", train.vocab_size(),
      ": validation needs the training files' kind of tokens");
  d.train = data::whole_segments(d.files);
  d.validation = data::whole_segments(d.validation_files);
  return d;
}

// "data: a.tokens, 1234 tokens (byte-level), train 1172" for one file; with
// several files or --val-token-file each side's files and tokens.
inline std::string describe(const TokenData& d) {
  const data::TokenFile& first = *d.files.front();
  const char* kind = first.from_llmc() ? "llm.c's file, GPT-2 tokens" : "byte-level";
  auto tokens = [](const std::vector<data::TokenSegment>& segments) {
    long long n = 0;
    for (const data::TokenSegment& s : segments) n += s.range.size();
    return n;
  };
  long long all = 0;
  for (const auto& f : d.files) all += f->size();
  if (d.files.size() == 1 && d.validation_files.empty()) {
    return str_cat("data: ", first.path(), ", ", all, " tokens (", kind, "), train ",
                   tokens(d.train));
  }
  return str_cat("data: ", data::describe(d.train), ", ", all, " tokens (", kind, "), train ",
                 tokens(d.train), "; validation ", data::describe(d.validation), ", ",
                 tokens(d.validation), " tokens");
}

}  // namespace loom::examples
