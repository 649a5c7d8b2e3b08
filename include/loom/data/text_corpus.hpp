// The text corpus of the GPT example, and its byte-level tokenizer.
//
// Corpus: a real text corpus every Debian machine has, so the example needs
// no download: the Python standard library's sources (*.py under the highest
// /usr/lib/python3.N/, minus site-packages and dist-packages, which vary per
// machine). Where no Python is installed, the plain-text files under
// /usr/share/doc. Files are read in sorted path order, so the same machine
// image always gives the same corpus; each file is one document.
//
// Tokenizer: byte-level. Byte b is token b (0 .. 255); token 256 ends a
// document, so the vocabulary has 257 ids. Why bytes: no vocabulary file to
// train, ship or version, every input is representable, and the model sees
// the same ids on every machine. The cost is longer sequences than a BPE
// tokenizer gives (about 3-4x for source code), which is fine for a
// benchmark-sized model; a model with a larger vocabulary (8192) simply
// never sees ids above 256.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::data {

inline constexpr int32_t kByteTokens = 256;     // ids 0 .. 255: the bytes
inline constexpr int32_t kEndOfDocument = 256;  // after every document
inline constexpr int32_t kByteVocabSize = 257;

struct TextCorpusOptions {
  // Directories to search; empty: the Python standard library, else /usr/share/doc.
  std::vector<std::string> roots = {};
  // File name suffixes that count as text (".py"); empty: every regular file.
  // Ignored for the defaults, which choose their own.
  std::vector<std::string> suffixes = {};
  // At most this many corpus bytes are read; the document that crosses the
  // cap is cut there (documents after it are left out).
  uint64_t max_bytes = uint64_t{16} << 20;
};

// The corpus files, in the order they are read (sorted paths). Throws
// loom::Error naming the searched directories if none holds a file.
std::vector<std::string> text_corpus_files(const TextCorpusOptions& options = {});

// Appends the byte-level tokens of `text` (one document, without its end marker).
void append_byte_tokens(const std::string& text, std::vector<uint16_t>& tokens);

}  // namespace loom::data
