// Datasets: the digits loader on a small file written here (parsing, scaling,
// errors that name the path and the fix), on the real file when
// scripts/fetch_digits.sh has fetched it (counts per class, the split), and
// the synthetic CIFAR / ImageNet batches (shapes, determinism, ranges).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "loom/data/dataset.hpp"
#include "loom/data/digits.hpp"
#include "loom/data/synthetic.hpp"
#include "support/compare.hpp"
#include "support/skip.hpp"

using Catch::Matchers::Contains;
using loom::Shape;
using loom::Tensor;
using loom::test::Near;
namespace data = loom::data;
namespace fs = std::filesystem;

namespace {

std::string write_temp(const std::string& name, const std::string& text) {
  const fs::path path = fs::temp_directory_path() / name;
  std::ofstream(path) << text;
  return path.string();
}

std::string digits_line(int pixel, int label) {
  std::string line;
  for (int i = 0; i < 64; ++i) line += std::to_string(i == 0 ? pixel : 0) + ",";
  return line + std::to_string(label) + "\n";
}

// The fetched file, if any: $LOOM_DATA_DIR first, then data/ in the source tree.
std::string fetched_digits() {
  const std::string by_env = data::default_digits_path();
  if (std::getenv("LOOM_DATA_DIR") != nullptr && fs::exists(by_env)) return by_env;
  const std::string in_tree = std::string(LOOM_SOURCE_DIR) + "/data/digits.csv.gz";
  return fs::exists(in_tree) ? in_tree : std::string();
}

}  // namespace

TEST_CASE("load_digits parses pixels and labels and names bad input", "[data][digits]") {
  const std::string path = write_temp("loom_digits_ok.csv", digits_line(16, 3) + digits_line(8, 9));
  const data::ImageDataset d = data::load_digits(path);
  CHECK(d.size() == 2);
  CHECK(d.classes == 10);
  CHECK(d.images.shape() == Shape{2, 1, 8, 8});
  CHECK(d.labels.to_vector<int32_t>() == std::vector<int32_t>{3, 9});
  const std::vector<float> pixels = d.images.to_vector<float>();
  CHECK(pixels[0] == 1.0f);
  CHECK(pixels[64] == 0.5f);
  CHECK(pixels[1] == 0.0f);

  CHECK_THROWS_WITH(
      data::load_digits("/nonexistent/digits.csv.gz"),
      Contains("'/nonexistent/digits.csv.gz'") && Contains("scripts/fetch_digits.sh"));
  CHECK_THROWS_WITH(data::load_digits(write_temp("loom_digits_short.csv", "1,2,3\n")),
                    Contains("line 1 has 3 values"));
  CHECK_THROWS_WITH(data::load_digits(write_temp("loom_digits_pixel.csv", digits_line(17, 1))),
                    Contains("pixel 0 is 17"));
  CHECK_THROWS_WITH(data::load_digits(write_temp("loom_digits_label.csv", digits_line(1, 12))),
                    Contains("label 12"));
}

TEST_CASE("the fetched digits: 1,797 images, their classes, a reproducible split",
          "[data][digits]") {
  const std::string path = fetched_digits();
  if (path.empty()) {
    LOOM_SKIP("digits.csv.gz not found in $LOOM_DATA_DIR or data/; run scripts/fetch_digits.sh");
  }
  const data::ImageDataset all = data::load_digits(path);
  REQUIRE(all.size() == data::kDigitsCount);
  std::vector<int> per_class(10, 0);
  for (int32_t label : all.labels.to_vector<int32_t>()) ++per_class[static_cast<size_t>(label)];
  CHECK(per_class == std::vector<int>{178, 182, 177, 183, 181, 182, 181, 179, 174, 180});
  loom::test::ValueRange pixels;
  for (float v : all.images.to_vector<float>()) pixels.add(v);
  CHECK(pixels.hi == 1.0f);

  const data::TrainTestSplit split = data::train_test_split(all, data::kDigitsTestCount, 0);
  CHECK(split.train.size() == 1500);
  CHECK(split.test.size() == 297);
  CHECK(split.test.images.shape() == Shape{297, 1, 8, 8});
  const data::TrainTestSplit again = data::train_test_split(all, data::kDigitsTestCount, 0);
  CHECK(again.test.labels.to_vector<int32_t>() == split.test.labels.to_vector<int32_t>());
  CHECK(again.train.images.to_vector<float>() == split.train.images.to_vector<float>());
  const data::TrainTestSplit other = data::train_test_split(all, data::kDigitsTestCount, 1);
  CHECK(other.test.labels.to_vector<int32_t>() != split.test.labels.to_vector<int32_t>());
}

TEST_CASE("train_test_split is a permutation", "[data]") {
  data::ImageDataset d;
  d.classes = 50;
  std::vector<float> images(50);
  std::vector<int32_t> labels(50);
  for (int i = 0; i < 50; ++i)
    images[static_cast<size_t>(i)] = float(i), labels[static_cast<size_t>(i)] = i;
  d.images = Tensor::from_vector(images, {50, 1});
  d.labels = Tensor::from_vector(labels, {50});
  const data::TrainTestSplit s = data::train_test_split(d, 10, 42);
  std::vector<int> seen(50, 0);
  const std::vector<int32_t> train = s.train.labels.to_vector<int32_t>();
  const std::vector<float> train_images = s.train.images.to_vector<float>();
  for (size_t i = 0; i < train.size(); ++i) {
    ++seen[static_cast<size_t>(train[i])];
    CHECK(train_images[i] == float(train[i]));  // images travel with their labels
  }
  for (int32_t label : s.test.labels.to_vector<int32_t>()) ++seen[static_cast<size_t>(label)];
  CHECK(seen == std::vector<int>(50, 1));
  CHECK_THROWS_WITH(data::train_test_split(d, 51, 0), Contains("test_count 51"));
}

TEST_CASE("synthetic CIFAR and ImageNet batches are deterministic per (seed, index)",
          "[data][synthetic]") {
  const data::ImageBatch a = data::synthetic_image_batch(data::kCifarShape, 8, 1, 0);
  CHECK(a.images.shape() == Shape{8, 3, 32, 32});
  CHECK(a.labels.shape() == Shape{8});
  const data::ImageBatch same = data::synthetic_image_batch(data::kCifarShape, 8, 1, 0);
  CHECK(same.images.to_vector<float>() == a.images.to_vector<float>());
  CHECK(same.labels.to_vector<int32_t>() == a.labels.to_vector<int32_t>());
  const data::ImageBatch next = data::synthetic_image_batch(data::kCifarShape, 8, 1, 1);
  CHECK(next.images.to_vector<float>() != a.images.to_vector<float>());

  const data::ImageBatch big = data::synthetic_image_batch(data::kImageNetShape, 2, 3, 5);
  CHECK(big.images.shape() == Shape{2, 3, 224, 224});
  double sum = 0, sum_sq = 0;
  const std::vector<float> v = big.images.to_vector<float>();
  for (float x : v) sum += x, sum_sq += double(x) * x;
  const double mean = sum / double(v.size());
  CHECK_THAT(mean, Near(0.0, 0.01));
  CHECK_THAT(sum_sq / double(v.size()) - mean * mean, Near(1.0, 0.01));
  const data::ImageBatch many = data::synthetic_image_batch(data::kImageNetShape, 4000, 3, 0);
  std::vector<int> hits(1000, 0);
  for (int32_t label : many.labels.to_vector<int32_t>()) {
    REQUIRE(label >= 0);
    REQUIRE(label < 1000);
    ++hits[static_cast<size_t>(label)];
  }
  int used = 0;
  for (int h : hits) used += h > 0;
  CHECK(used > 950);  // 4000 uniform draws leave about 18 of 1000 classes unused
}
