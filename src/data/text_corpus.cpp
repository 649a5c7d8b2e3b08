// Corpus discovery: which files, in which order.
#include "loom/data/text_corpus.hpp"

#include <algorithm>
#include <filesystem>
#include <regex>
#include <system_error>

#include "loom/core/error.hpp"

namespace loom::data {
namespace {

namespace fs = std::filesystem;

// /usr/lib/python3.N with the largest N, or "" if there is none.
std::string python_stdlib_dir() {
  const std::regex versioned("python3\\.([0-9]+)");
  std::error_code error;
  std::string best;
  int best_minor = -1;
  for (const auto& entry : fs::directory_iterator("/usr/lib", error)) {
    const std::string name = entry.path().filename().string();
    std::smatch match;
    if (!std::regex_match(name, match, versioned) || !entry.is_directory(error)) continue;
    const int minor = std::stoi(match[1].str());
    if (minor > best_minor) {
      best_minor = minor;
      best = entry.path().string();
    }
  }
  return best;
}

bool has_suffix(const std::string& name, const std::vector<std::string>& suffixes) {
  if (suffixes.empty()) return true;
  return std::any_of(suffixes.begin(), suffixes.end(), [&](const std::string& s) {
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  });
}

// Regular files under `root` with one of `suffixes`, skipping directories named in `skip`.
void collect(const std::string& root, const std::vector<std::string>& suffixes,
             const std::vector<std::string>& skip, std::vector<std::string>& out) {
  std::error_code error;
  fs::recursive_directory_iterator it(root, fs::directory_options::skip_permission_denied, error);
  for (; !error && it != fs::recursive_directory_iterator(); it.increment(error)) {
    const fs::directory_entry& entry = *it;
    const std::string name = entry.path().filename().string();
    std::error_code kind_error;
    if (entry.is_directory(kind_error)) {
      if (std::find(skip.begin(), skip.end(), name) != skip.end()) it.disable_recursion_pending();
      continue;
    }
    if (entry.is_regular_file(kind_error) && !entry.is_symlink(kind_error) &&
        has_suffix(name, suffixes)) {
      out.push_back(entry.path().string());
    }
  }
}

}  // namespace

std::vector<std::string> text_corpus_files(const TextCorpusOptions& options) {
  std::vector<std::string> files;
  std::vector<std::string> searched;
  if (!options.roots.empty()) {
    for (const std::string& root : options.roots) collect(root, options.suffixes, {}, files);
    searched = options.roots;
  } else {
    const std::string python = python_stdlib_dir();
    if (!python.empty()) {
      collect(python, {".py"}, {"site-packages", "dist-packages", "__pycache__"}, files);
      searched.push_back(python);
    }
    if (files.empty()) {
      // Compressed changelogs and binary examples are not text.
      collect("/usr/share/doc", {"README", "copyright", ".txt", ".md", ".rst"}, {}, files);
      searched.push_back("/usr/share/doc");
    }
  }
  std::sort(files.begin(), files.end());
  std::string where;
  for (const std::string& s : searched) where += (where.empty() ? "" : ", ") + s;
  LOOM_CHECK(!files.empty(), "text corpus: no text files found under ", where);
  return files;
}

void append_byte_tokens(const std::string& text, std::vector<uint16_t>& tokens) {
  tokens.reserve(tokens.size() + text.size());
  for (const char c : text) tokens.push_back(static_cast<uint16_t>(static_cast<unsigned char>(c)));
}

}  // namespace loom::data
