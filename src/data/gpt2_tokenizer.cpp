// GPT-2's tokenizer: the pre-token scanner, the files' byte alphabet, BPE.
#include "loom/data/gpt2_tokenizer.hpp"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iterator>
#include <nlohmann/json.hpp>
#include <queue>

#include "loom/core/error.hpp"
#include "loom/data/text_corpus.hpp"

namespace loom::data {
namespace {

namespace fs = std::filesystem;

struct CodePointRange {
  char32_t first;
  char32_t last;
};

#include "unicode_classes.inc"

enum class CharClass : uint8_t { kLetter, kNumber, kSpace, kOther };

template <size_t N>
bool in_ranges(const CodePointRange (&ranges)[N], char32_t cp) {
  const auto* after =
      std::upper_bound(std::begin(ranges), std::end(ranges), cp,
                       [](char32_t c, const CodePointRange& r) { return c < r.first; });
  return after != std::begin(ranges) && cp <= (after - 1)->last;
}

CharClass classify(char32_t cp) {
  if (cp < 0x80) {
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return CharClass::kLetter;
    if (cp >= '0' && cp <= '9') return CharClass::kNumber;
    if (cp == ' ' || (cp >= '\t' && cp <= '\r')) return CharClass::kSpace;
    return CharClass::kOther;
  }
  if (in_ranges(kLetterRanges, cp)) return CharClass::kLetter;
  if (in_ranges(kNumberRanges, cp)) return CharClass::kNumber;
  if (in_ranges(kWhiteSpaceRanges, cp)) return CharClass::kSpace;
  return CharClass::kOther;
}

// The code point of `text` at byte `pos` and its length in bytes. A byte
// that does not begin a well-formed UTF-8 sequence (a stray continuation
// byte, an overlong form, a surrogate, beyond U+10FFFF, cut short) is one
// character of its own, returned as U+FFFFFFFF, which classify() calls other.
struct CodePoint {
  char32_t value;
  size_t bytes;
};
constexpr char32_t kNotUtf8 = 0xFFFFFFFF;

CodePoint decode_utf8(std::string_view text, size_t pos) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(pos);
  if (lead < 0x80) return {lead, 1};
  size_t length = 0;
  char32_t value = 0;
  char32_t least = 0;  // the smallest value this length may encode (no overlong forms)
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2, value = lead & 0x1F, least = 0x80;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3, value = lead & 0x0F, least = 0x800;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4, value = lead & 0x07, least = 0x10000;
  } else {
    return {kNotUtf8, 1};
  }
  if (pos + length > text.size()) return {kNotUtf8, 1};
  for (size_t i = 1; i < length; ++i) {
    const unsigned char next = byte(pos + i);
    if ((next & 0xC0) != 0x80) return {kNotUtf8, 1};
    value = (value << 6) | (next & 0x3F);
  }
  if (value < least || value > 0x10FFFF || (value >= 0xD800 && value <= 0xDFFF)) {
    return {kNotUtf8, 1};
  }
  return {value, length};
}

// The length of the contraction ('s 't 're 've 'm 'll 'd) at `pos`, or 0.
size_t contraction_length(std::string_view text, size_t pos) {
  if (text[pos] != '\'' || pos + 1 >= text.size()) return 0;
  const char a = text[pos + 1];
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (pos + 2 >= text.size()) return 0;
  const char b = text[pos + 2];
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

// GPT-2's byte alphabet (bytes_to_unicode in OpenAI's encoder.py): the
// printable bytes '!'..'~', 0xA1..0xAC and 0xAE..0xFF stand for themselves;
// the others (0x00..0x20, 0x7F..0xA0, 0xAD) for U+0100 onwards, in order.
// Returns the byte each character of the alphabet stands for, by code point
// (-1 outside the alphabet).
std::vector<int> byte_of_character() {
  std::vector<int> byte_of(0x144, -1);
  int next = 0x100;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    byte_of[printable ? b : next++] = b;
  }
  return byte_of;
}

// The bytes a token of the files stands for; throws naming `what` when a
// character is outside the alphabet.
std::string alphabet_to_bytes(std::string_view token, const std::vector<int>& byte_of,
                              const std::string& what) {
  std::string bytes;
  for (size_t pos = 0; pos < token.size();) {
    const CodePoint cp = decode_utf8(token, pos);
    const bool known = cp.value < byte_of.size() && byte_of[cp.value] >= 0;
    LOOM_CHECK(known, what, ": character ",
               cp.value == kNotUtf8
                   ? std::string("(not UTF-8)")
                   : str_cat("U+", std::hex, std::uppercase, static_cast<uint32_t>(cp.value)),
               " at byte ", pos,
               " is outside GPT-2's byte alphabet (bytes_to_unicode), so the "
               "token stands for no bytes");
    bytes.push_back(static_cast<char>(byte_of[cp.value]));
    pos += cp.bytes;
  }
  return bytes;
}

std::string read_file(const fs::path& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  LOOM_CHECK(in, what, " ", path.string(), ": cannot open it");
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace

// NOTE [gpt-2 pre-tokens]
// GPT-2's pattern, tried at each position in its order (the first
// alternative that matches wins, each one greedy):
//   's 't 're 've 'm 'll 'd      a contraction (ASCII, case-sensitive)
//   ' ?\p{L}+'                   letters, with at most one space before
//   ' ?\p{N}+'                   numbers, likewise
//   ' ?[^\s\p{L}\p{N}]+'         anything else, likewise
//   '\s+(?!\S)'                  white space not followed by a non-space:
//                                a run at the end of the text whole, else
//                                the run but its last character, which then
//                                prefixes the next pre-token (" word")
//   '\s+'                        a single white space before a non-space
// The optional prefix is U+0020 alone; other white space ('\n') never joins
// a word. The scanner below does the same without a regular expression
// engine; the test compares it with Hugging Face's tokenizers, which runs the
// pattern itself.
std::vector<std::string_view> gpt2_pre_tokens(std::string_view text) {
  std::vector<std::string_view> pieces;
  const size_t n = text.size();
  size_t pos = 0;
  while (pos < n) {
    size_t length = contraction_length(text, pos);
    if (length == 0) {
      size_t start = pos;  // where the run of one class begins
      CodePoint cp = decode_utf8(text, pos);
      CharClass kind = classify(cp.value);
      if (text[pos] == ' ' && pos + 1 < n) {
        const CodePoint next = decode_utf8(text, pos + 1);
        const CharClass next_kind = classify(next.value);
        if (next_kind != CharClass::kSpace) start = pos + 1, cp = next, kind = next_kind;
      }
      size_t end = start + cp.bytes;
      if (kind != CharClass::kSpace) {
        while (end < n) {
          const CodePoint c = decode_utf8(text, end);
          if (classify(c.value) != kind) break;
          end += c.bytes;
        }
        length = end - pos;
      } else {
        size_t last = start;  // where the run's last character begins
        while (end < n) {
          const CodePoint c = decode_utf8(text, end);
          if (classify(c.value) != CharClass::kSpace) break;
          last = end;
          end += c.bytes;
        }
        length = (end < n && last > pos) ? last - pos : end - pos;
      }
    }
    pieces.push_back(text.substr(pos, length));
    pos += length;
  }
  return pieces;
}

Gpt2Tokenizer::Gpt2Tokenizer(const fs::path& vocab_json, const fs::path& merges_txt) {
  const std::vector<int> byte_of = byte_of_character();
  const std::string vocab_name = vocab_json.string();
  const std::string merges_name = merges_txt.string();

  nlohmann::json vocab;
  try {
    vocab = nlohmann::json::parse(read_file(vocab_json, "vocabulary"));
  } catch (const nlohmann::json::exception& e) {
    throw Error(str_cat("vocabulary ", vocab_name, ": not JSON: ", e.what()));
  }
  LOOM_CHECK(vocab.is_object() && !vocab.empty(), "vocabulary ", vocab_name,
             ": expected a JSON object of token -> id, got ", vocab.type_name());
  constexpr int64_t kMaxId = INT32_MAX - 1;
  std::unordered_map<std::string, int32_t> id_of;
  id_of.reserve(vocab.size());
  for (const auto& [token, id_json] : vocab.items()) {
    const std::string what = str_cat("vocabulary ", vocab_name, ": token \"", token, "\"");
    LOOM_CHECK(id_json.is_number_integer() && id_json.get<int64_t>() >= 0 &&
                   id_json.get<int64_t>() <= kMaxId,
               what, ": id ", id_json.dump(), " is not an integer in [0, ", kMaxId, "]");
    const auto id = static_cast<int32_t>(id_json.get<int64_t>());
    std::string bytes = alphabet_to_bytes(token, byte_of, what);
    if (static_cast<size_t>(id) >= token_bytes_.size()) {
      token_bytes_.resize(static_cast<size_t>(id) + 1);
      has_id_.resize(static_cast<size_t>(id) + 1, false);
    }
    LOOM_CHECK(!has_id_[id], what, ": id ", id, " already belongs to token \"", token_bytes_[id],
               "\" (as bytes): ids must be unique");
    has_id_[id] = true;
    token_bytes_[id] = bytes;
    id_of.emplace(std::move(bytes), id);
    if (token == "<|endoftext|>") end_of_text_ = id;
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = id_of.find(std::string(1, static_cast<char>(b)));
    LOOM_CHECK(it != id_of.end(), "vocabulary ", vocab_name, ": byte 0x", std::hex, b,
               " has no token of its own; byte-level BPE needs one for each of the 256 bytes");
    byte_ids_[b] = it->second;
  }

  const std::string text = read_file(merges_txt, "merges");
  size_t line_start = 0;
  int64_t line_number = 0;
  int32_t rank = 0;
  while (line_start < text.size()) {
    size_t line_end = text.find('\n', line_start);
    if (line_end == std::string::npos) line_end = text.size();
    std::string_view line(text.data() + line_start, line_end - line_start);
    line_start = line_end + 1;
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_number == 1 && line.starts_with("#version"))) continue;
    const std::string where =
        str_cat("merges ", merges_name, ": line ", line_number, " \"", std::string(line), "\"");
    const size_t space = line.find(' ');
    LOOM_CHECK(space != std::string_view::npos && space > 0 && space + 1 < line.size() &&
                   line.find(' ', space + 1) == std::string_view::npos,
               where, ": expected two tokens separated by one space");
    const std::string left = alphabet_to_bytes(line.substr(0, space), byte_of, where);
    const std::string right = alphabet_to_bytes(line.substr(space + 1), byte_of, where);
    const auto left_id = id_of.find(left);
    const auto right_id = id_of.find(right);
    const auto result_id = id_of.find(left + right);
    LOOM_CHECK(left_id != id_of.end() && right_id != id_of.end(), where,
               ": merges a token the vocabulary lacks");
    LOOM_CHECK(result_id != id_of.end(), where, ": the merged token is not in the vocabulary");
    // A pair listed twice keeps its first (highest-priority) line.
    merges_.try_emplace(pair_key(left_id->second, right_id->second),
                        Merge{rank, result_id->second});
    ++rank;
  }
  merge_count_ = rank;
}

Gpt2Tokenizer Gpt2Tokenizer::from_directory(const fs::path& dir) {
  if (fs::exists(dir / "vocab.json") || !fs::exists(dir / "encoder.json")) {
    LOOM_CHECK(fs::exists(dir / "vocab.json") && fs::exists(dir / "merges.txt"), "tokenizer ",
               dir.string(),
               ": expected vocab.json and merges.txt (Hugging Face) or "
               "encoder.json and vocab.bpe (OpenAI) in it");
    return Gpt2Tokenizer(dir / "vocab.json", dir / "merges.txt");
  }
  LOOM_CHECK(fs::exists(dir / "vocab.bpe"), "tokenizer ", dir.string(),
             ": has encoder.json but no vocab.bpe beside it");
  return Gpt2Tokenizer(dir / "encoder.json", dir / "vocab.bpe");
}

// NOTE [bpe merge order]
// GPT-2's own algorithm (OpenAI's encoder.py) repeats: find the pair of
// adjacent tokens whose merge comes first, merge each of its occurrences left
// to right. That is O(n^2) in a pre-token's n bytes, fine for words and fatal
// for a long run of letters (a base64 blob, a DNA sequence: a pre-token of a
// megabyte would take minutes). Long pre-tokens therefore go through a heap of
// candidate pairs ordered by (merge rank, position), with the tokens in a
// linked list: O(n log n). The two agree because a merge's result is a
// longer token than either side, so the pairs a merge creates are other
// pairs, later in a trained merges file than the merge that made them: taking
// candidates by rank, leftmost first, performs the same merges in the same
// order as the reference's passes (both are checked against Hugging Face's
// tokenizers, which merges with a heap too).
void Gpt2Tokenizer::merge(std::vector<int32_t>& parts) const {
  constexpr size_t kShort = 48;  // bytes; the reference's passes below, the heap above
  if (parts.size() <= kShort) {
    merge_short(parts);
  } else {
    merge_long(parts);
  }
}

void Gpt2Tokenizer::merge_short(std::vector<int32_t>& parts) const {
  while (parts.size() > 1) {
    int32_t best_rank = INT32_MAX;
    Merge best;
    int32_t left = 0;
    int32_t right = 0;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      const auto it = merges_.find(pair_key(parts[i], parts[i + 1]));
      if (it != merges_.end() && it->second.rank < best_rank) {
        best_rank = it->second.rank;
        best = it->second;
        left = parts[i];
        right = parts[i + 1];
      }
    }
    if (best_rank == INT32_MAX) return;
    size_t out = 0;
    for (size_t i = 0; i < parts.size();) {
      if (i + 1 < parts.size() && parts[i] == left && parts[i + 1] == right) {
        parts[out++] = best.result;
        i += 2;
      } else {
        parts[out++] = parts[i++];
      }
    }
    parts.resize(out);
  }
}

void Gpt2Tokenizer::merge_long(std::vector<int32_t>& parts) const {
  const auto n = static_cast<int64_t>(parts.size());
  std::vector<int64_t> next(static_cast<size_t>(n)), prev(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) next[i] = i + 1, prev[i] = i - 1;
  struct Candidate {
    int32_t rank;
    int64_t position;  // of the left token; a merged token keeps its left one's
    int32_t left, right, result;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : position > o.position;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  const auto consider = [&](int64_t position) {
    const int64_t after = next[position];
    if (after >= n) return;
    const auto it = merges_.find(pair_key(parts[position], parts[after]));
    if (it == merges_.end()) return;
    heap.push({it->second.rank, position, parts[position], parts[after], it->second.result});
  };
  for (int64_t i = 0; i + 1 < n; ++i) consider(i);
  constexpr int32_t kGone = -1;
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    const int64_t after = next[c.position];
    // Stale: either side has been merged since the candidate was made.
    if (parts[c.position] != c.left || after >= n || parts[after] != c.right) continue;
    parts[c.position] = c.result;
    parts[after] = kGone;
    next[c.position] = next[after];
    if (next[after] < n) prev[next[after]] = c.position;
    if (prev[c.position] >= 0) consider(prev[c.position]);
    consider(c.position);
  }
  parts.erase(std::remove(parts.begin(), parts.end(), kGone), parts.end());
}

void Gpt2Tokenizer::encode(std::string_view text, std::vector<int32_t>& ids) const {
  std::vector<int32_t> parts;
  for (const std::string_view piece : gpt2_pre_tokens(text)) {
    parts.clear();
    for (const char c : piece) parts.push_back(byte_ids_[static_cast<unsigned char>(c)]);
    merge(parts);
    ids.insert(ids.end(), parts.begin(), parts.end());
  }
}

std::vector<int32_t> Gpt2Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  encode(text, ids);
  return ids;
}

const std::string& Gpt2Tokenizer::token_bytes(int32_t id) const {
  LOOM_CHECK(has_token(id), "token id ", id, " is not in the vocabulary (", vocab_size(), " ids)");
  return token_bytes_[id];
}

std::string Gpt2Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string text;
  for (const int32_t id : ids) text += token_bytes(id);
  return text;
}

TextTokens TextTokens::bytes() {
  return TextTokens{};
}

TextTokens TextTokens::gpt2(Gpt2Tokenizer tokenizer) {
  TextTokens tokens;
  tokens.bpe_ = std::move(tokenizer);
  return tokens;
}

std::vector<int32_t> TextTokens::encode(std::string_view text) const {
  if (bpe_) return bpe_->encode(text);
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  for (const char c : text) ids.push_back(static_cast<unsigned char>(c));
  return ids;
}

std::string TextTokens::decode(int32_t id) const {
  if (bpe_ && bpe_->has_token(id)) return bpe_->token_bytes(id);
  if (!bpe_ && id >= 0 && id < kByteTokens) return std::string(1, static_cast<char>(id));
  if (id == end_of_text()) return "<|endoftext|>";
  return "<|" + std::to_string(id) + "|>";
}

std::optional<int32_t> TextTokens::end_of_text() const {
  return bpe_ ? bpe_->end_of_text() : std::optional<int32_t>(kEndOfDocument);
}

int32_t TextTokens::vocab_size() const {
  return bpe_ ? bpe_->vocab_size() : kByteVocabSize;
}

}  // namespace loom::data
