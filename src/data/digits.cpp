#include "loom/data/digits.hpp"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <vector>

#if LOOM_HAS_ZLIB
#include <zlib.h>
#endif

namespace loom::data {
namespace {

constexpr int64_t kPixels = 64;
constexpr const char* kFetchHint = "; run scripts/fetch_digits.sh to download it";

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string read_file(const std::string& path) {
  std::ifstream probe(path, std::ios::binary);
  LOOM_CHECK(probe.good(), "digits: cannot open '", path, "'", kFetchHint,
             " (or set LOOM_DATA_DIR to the directory holding digits.csv.gz)");
  if (!ends_with(path, ".gz")) {
    std::ostringstream text;
    text << probe.rdbuf();
    return text.str();
  }
#if LOOM_HAS_ZLIB
  gzFile file = gzopen(path.c_str(), "rb");
  LOOM_CHECK(file != nullptr, "digits: zlib cannot open '", path, "'");
  std::string text;
  char buffer[1 << 16];
  int got = 0;
  while ((got = gzread(file, buffer, sizeof(buffer))) > 0)
    text.append(buffer, static_cast<size_t>(got));
  int status = Z_OK;
  const char* message = got < 0 ? gzerror(file, &status) : nullptr;
  const std::string error = message != nullptr ? message : "";
  gzclose(file);
  LOOM_CHECK(got == 0, "digits: '", path, "' is not a valid gzip file (", error, ")", kFetchHint);
  return text;
#else
  throw Error("digits: '" + path +
              "' is gzip-compressed but Loom was built without zlib; install zlib1g-dev and "
              "rebuild, or gunzip the file and load the .csv");
#endif
}

}  // namespace

std::string default_digits_path() {
  const char* dir = std::getenv("LOOM_DATA_DIR");
  return (dir != nullptr && dir[0] != '\0' ? std::string(dir) : std::string("data")) +
         "/digits.csv.gz";
}

ImageDataset load_digits(const std::string& path) {
  const std::string text = read_file(path);
  std::vector<float> pixels;
  std::vector<int32_t> labels;
  pixels.reserve(static_cast<size_t>(kDigitsCount * kPixels));
  labels.reserve(static_cast<size_t>(kDigitsCount));
  std::istringstream lines(text);
  std::string line;
  int64_t line_number = 0;
  while (std::getline(lines, line)) {
    ++line_number;
    if (line.empty() || line == "\r") continue;
    std::vector<long> values;
    const char* p = line.c_str();
    while (*p != '\0' && *p != '\r') {
      char* end = nullptr;
      const long v = std::strtol(p, &end, 10);
      LOOM_CHECK(end != p, "digits: '", path, "' line ", line_number, " is not a list of integers");
      values.push_back(v);
      p = *end == ',' ? end + 1 : end;
    }
    LOOM_CHECK(static_cast<int64_t>(values.size()) == kPixels + 1, "digits: '", path, "' line ",
               line_number, " has ", values.size(), " values; each line holds ", kPixels,
               " pixels and a label");
    for (int64_t i = 0; i < kPixels; ++i) {
      const long v = values[static_cast<size_t>(i)];
      LOOM_CHECK(v >= 0 && v <= 16, "digits: '", path, "' line ", line_number, ": pixel ", i,
                 " is ", v, "; pixels are 0..16");
      pixels.push_back(static_cast<float>(v) / 16.0f);
    }
    const long label = values.back();
    LOOM_CHECK(label >= 0 && label <= 9, "digits: '", path, "' line ", line_number, ": label ",
               label, " is not a digit 0..9");
    labels.push_back(static_cast<int32_t>(label));
  }
  LOOM_CHECK(!labels.empty(), "digits: '", path, "' holds no examples", kFetchHint);
  const auto n = static_cast<int64_t>(labels.size());
  ImageDataset out;
  out.images = Tensor::from_vector(pixels, {n, 1, 8, 8});
  out.labels = Tensor::from_vector(labels, {n});
  out.classes = 10;
  return out;
}

}  // namespace loom::data
