// Token files: the atomic build, the validating memory map, the splits.
#include "loom/data/token_file.hpp"

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "core/atomic_file.hpp"
#include "loom/core/error.hpp"

namespace loom::data {
namespace {

namespace fs = std::filesystem;

constexpr std::array<char, 8> kMagic = {'L', 'O', 'O', 'M', 'T', 'O', 'K', '\0'};

struct Header {
  std::array<char, 8> magic = kMagic;
  uint32_t version = kTokenFileVersion;
  uint32_t vocab_size = kByteVocabSize;
  uint64_t token_count = 0;
  uint32_t dtype = kTokenDTypeU16;
  uint32_t reserved = 0;
};
static_assert(sizeof(Header) == kTokenFileHeaderBytes, "the header is 32 bytes, no padding");
static_assert(std::endian::native == std::endian::little, "token files are little-endian");

std::string errno_text() {
  return std::strerror(errno);
}

// Closes a file descriptor on scope exit.
struct FileDescriptor {
  int fd = -1;
  ~FileDescriptor() {
    if (fd >= 0) ::close(fd);
  }
};

void check_below_vocab(const std::string& path, std::span<const uint16_t> tokens,
                       uint32_t vocab_size) {
  const auto bad =
      std::find_if(tokens.begin(), tokens.end(), [&](uint16_t t) { return t >= vocab_size; });
  LOOM_CHECK(bad == tokens.end(), "token file ", path, ": token ", bad - tokens.begin(), " is ",
             bad == tokens.end() ? 0 : *bad, ", not below the vocab size ", vocab_size,
             "; nothing written");
}

// Reads the corpus, one document per file, up to the byte cap.
std::vector<uint16_t> tokenize_corpus(const TextCorpusOptions& options, TokenFileSummary& summary) {
  std::vector<uint16_t> tokens;
  for (const std::string& file : text_corpus_files(options)) {
    if (summary.corpus_bytes >= options.max_bytes) break;
    std::ifstream in(file, std::ios::binary);
    if (!in) continue;  // unreadable (permissions): not part of the corpus
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const uint64_t room = options.max_bytes - summary.corpus_bytes;
    if (text.size() > room) text.resize(static_cast<size_t>(room));
    append_byte_tokens(text, tokens);
    tokens.push_back(static_cast<uint16_t>(kEndOfDocument));
    summary.corpus_bytes += text.size();
    summary.documents += 1;
  }
  summary.tokens = tokens.size();
  return tokens;
}

}  // namespace

TokenFileSummary build_token_file(const std::string& output_path, const TokenFileOptions& options) {
  TokenFileSummary summary;
  const std::vector<uint16_t> tokens = tokenize_corpus(options.corpus, summary);
  LOOM_CHECK(!tokens.empty(), "token file ", output_path,
             ": the corpus is empty (max_bytes = ", options.corpus.max_bytes, ")");
  write_token_file(output_path, tokens, kByteVocabSize);
  return summary;
}

// Both writers put header + tokens so that `path` is whole or absent (NOTE
// [atomic files]).
void write_token_file(const std::string& path, std::span<const uint16_t> tokens,
                      uint32_t vocab_size) {
  LOOM_CHECK(vocab_size >= 1 && vocab_size <= 65536, "token file ", path, ": vocab size ",
             vocab_size, " does not fit uint16 tokens (1 to 65536)");
  check_below_vocab(path, tokens, vocab_size);
  detail::write_file_atomically(path, "token file", [&](detail::FileSink& sink) {
    Header header;
    header.vocab_size = vocab_size;
    header.token_count = tokens.size();
    sink.write(&header, sizeof(header));
    sink.write(tokens.data(), tokens.size() * sizeof(uint16_t));
  });
}

void write_llmc_token_file(const std::string& path, std::span<const uint16_t> tokens) {
  LOOM_CHECK(tokens.size() <= static_cast<size_t>(INT32_MAX), "token file ", path, ": ",
             tokens.size(), " tokens do not fit llm.c's int32 token count");
  check_below_vocab(path, tokens, kGpt2VocabSize);
  detail::write_file_atomically(path, "token file", [&](detail::FileSink& sink) {
    std::array<int32_t, kLlmcHeaderBytes / sizeof(int32_t)> header{};
    header[0] = kLlmcMagic;
    header[1] = 1;
    header[2] = static_cast<int32_t>(tokens.size());
    sink.write(header.data(), sizeof(header));
    sink.write(tokens.data(), tokens.size() * sizeof(uint16_t));
  });
}

bool ensure_token_file(const std::string& path, const TokenFileOptions& options) {
  std::error_code error;
  if (fs::exists(path, error)) {
    const TokenFile existing(path);  // throws if it is not a valid token file
    return false;
  }
  build_token_file(path, options);
  return true;
}

TokenFile::TokenFile(const std::string& path) : path_(path) {
  FileDescriptor file{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  LOOM_CHECK(file.fd >= 0, "token file ", path, ": cannot open: ", errno_text());
  struct stat info {};
  LOOM_CHECK(::fstat(file.fd, &info) == 0, "token file ", path, ": cannot stat: ", errno_text());
  const auto file_bytes = static_cast<uint64_t>(info.st_size);
  LOOM_CHECK(file_bytes >= kTokenFileHeaderBytes, "token file ", path, ": ", file_bytes,
             " bytes is shorter than the ", kTokenFileHeaderBytes,
             "-byte header (truncated, or not a token file)");

  mapping_bytes_ = static_cast<size_t>(file_bytes);
  void* map = ::mmap(nullptr, mapping_bytes_, PROT_READ, MAP_SHARED, file.fd, 0);
  LOOM_CHECK(map != MAP_FAILED, "token file ", path, ": mmap of ", file_bytes,
             " bytes failed: ", errno_text());
  mapping_ = map;
  try {
    int32_t first = 0;
    std::memcpy(&first, mapping_, sizeof(first));
    if (first == kLlmcMagic) {
      map_llmc(file_bytes);
      return;
    }
    Header header;
    std::memcpy(&header, mapping_, sizeof(header));
    LOOM_CHECK(header.magic == kMagic, "token file ", path,
               ": wrong magic (expected \"LOOMTOK\", or llm.c's ", kLlmcMagic,
               "): not a token file");
    LOOM_CHECK(header.version == kTokenFileVersion, "token file ", path, ": version ",
               header.version, " is not the supported version ", kTokenFileVersion);
    LOOM_CHECK(header.dtype == kTokenDTypeU16, "token file ", path, ": token dtype code ",
               header.dtype, " is not ", kTokenDTypeU16, " (uint16)");
    LOOM_CHECK(header.vocab_size >= 1 && header.vocab_size <= 65536, "token file ", path,
               ": vocab size ", header.vocab_size, " does not fit uint16 tokens");
    const uint64_t expected = kTokenFileHeaderBytes + header.token_count * sizeof(uint16_t);
    LOOM_CHECK(header.token_count <= file_bytes / sizeof(uint16_t) && expected == file_bytes,
               "token file ", path, ": the header says ", header.token_count, " tokens (", expected,
               " bytes with the header) but the file has ", file_bytes,
               " bytes (truncated or corrupt)");
    set_tokens(kTokenFileHeaderBytes, header.token_count, header.vocab_size);
  } catch (...) {
    ::munmap(mapping_, mapping_bytes_);
    mapping_ = nullptr;
    throw;
  }
}

void TokenFile::map_llmc(uint64_t file_bytes) {
  LOOM_CHECK(file_bytes >= kLlmcHeaderBytes, "token file ", path_, ": ", file_bytes,
             " bytes is shorter than llm.c's ", kLlmcHeaderBytes, "-byte header (truncated)");
  std::array<int32_t, 3> header{};  // magic, version, token count
  std::memcpy(header.data(), mapping_, sizeof(header));
  LOOM_CHECK(header[1] == 1, "token file ", path_, ": llm.c version ", header[1],
             " is not version 1 (uint16 GPT-2 tokens; version 2 holds uint32 tokens)");
  LOOM_CHECK(header[2] >= 0, "token file ", path_, ": llm.c header says ", header[2],
             " tokens (corrupt)");
  const auto count = static_cast<uint64_t>(header[2]);
  const uint64_t expected = kLlmcHeaderBytes + count * sizeof(uint16_t);
  LOOM_CHECK(expected == file_bytes, "token file ", path_, ": llm.c header says ", count,
             " tokens (", expected, " bytes with the header) but the file has ", file_bytes,
             " bytes (truncated or corrupt)");
  set_tokens(kLlmcHeaderBytes, count, kGpt2VocabSize);
  from_llmc_ = true;
}

void TokenFile::set_tokens(uint64_t offset, uint64_t count, uint32_t vocab_size) {
  vocab_size_ = vocab_size;
  tokens_ = std::span<const uint16_t>(
      reinterpret_cast<const uint16_t*>(static_cast<const char*>(mapping_) + offset),
      static_cast<size_t>(count));
  // One pass over the tokens (milliseconds for the default 16 MiB corpus) so a
  // corrupt body fails here, not as an out-of-range embedding row mid-training.
  const auto bad =
      std::find_if(tokens_.begin(), tokens_.end(), [&](uint16_t t) { return t >= vocab_size_; });
  LOOM_CHECK(bad == tokens_.end(), "token file ", path_, ": token ", bad - tokens_.begin(), " is ",
             bad == tokens_.end() ? 0 : *bad, ", not below the vocab size ", vocab_size_,
             " (corrupt)");
}

TokenFile::~TokenFile() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapping_bytes_);
}

std::span<const uint16_t> TokenFile::tokens(TokenRange range) const {
  LOOM_CHECK(range.begin >= 0 && range.begin <= range.end && range.end <= size(), "token file ",
             path_, ": range [", range.begin, ", ", range.end, ") is outside its ", size(),
             " tokens");
  return tokens_.subspan(static_cast<size_t>(range.begin), static_cast<size_t>(range.size()));
}

std::vector<std::string> token_file_paths(const std::string& pattern) {
  if (pattern.find_first_of("*?[") == std::string::npos) return {pattern};
  glob_t matches{};
  const int rc = glob(pattern.c_str(), GLOB_ERR, nullptr, &matches);
  std::vector<std::string> paths;
  if (rc == 0) {
    for (size_t i = 0; i < matches.gl_pathc; ++i) paths.emplace_back(matches.gl_pathv[i]);
  }
  globfree(&matches);
  LOOM_CHECK(rc == 0 || rc == GLOB_NOMATCH, "token files '", pattern,
             "': the pattern could not be read (",
             rc == GLOB_ABORTED ? "a directory could not be opened" : "out of memory", ")");
  LOOM_CHECK(!paths.empty(), "token files '", pattern, "': no file matches the pattern");
  std::sort(paths.begin(), paths.end());
  return paths;
}

TokenRange TokenFile::train_range(double validation_fraction) const {
  return TokenRange{0, validation_range(validation_fraction).begin};
}

TokenRange TokenFile::validation_range(double validation_fraction) const {
  LOOM_CHECK(validation_fraction >= 0.0 && validation_fraction < 1.0, "token file ", path_,
             ": validation fraction ", validation_fraction, " must be in [0, 1)");
  const auto count = static_cast<int64_t>(std::floor(validation_fraction * double(size())));
  return TokenRange{size() - count, size()};
}

double unigram_entropy(std::span<const uint16_t> tokens) {
  if (tokens.empty()) return 0.0;
  std::vector<uint64_t> counts(65536, 0);
  for (const uint16_t t : tokens) counts[t] += 1;
  const double n = static_cast<double>(tokens.size());
  double entropy = 0.0;
  for (const uint64_t c : counts) {
    if (c == 0) continue;
    const double p = static_cast<double>(c) / n;
    entropy -= p * std::log(p);
  }
  return entropy;
}

}  // namespace loom::data
