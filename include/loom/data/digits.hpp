// The 1,797 8x8 grey-scale handwritten digits (the UCI optdigits test set as
// scikit-learn ships it): a small real dataset for end-to-end training tests.
//
// scripts/fetch_digits.sh downloads it (from Debian's python3-sklearn
// package, without installing anything) to $LOOM_DATA_DIR/digits.csv.gz or
// data/digits.csv.gz. Each line holds 64 pixel values 0..16 row by row and
// the label 0..9.
#pragma once

#include <string>

#include "loom/data/dataset.hpp"

namespace loom::data {

inline constexpr int64_t kDigitsCount = 1797;
inline constexpr int64_t kDigitsTestCount = 297;  // the split the examples use (1,500 train)

// $LOOM_DATA_DIR/digits.csv.gz if LOOM_DATA_DIR is set, else data/digits.csv.gz.
std::string default_digits_path();

// images f32 [N, 1, 8, 8] scaled to [0, 1] (pixel / 16), labels i32 [N], 10 classes.
// Reads .csv.gz (zlib) or an uncompressed .csv. Throws loom::Error naming the
// path when it is missing (and how to fetch it) or a line is malformed.
ImageDataset load_digits(const std::string& path = default_digits_path());

}  // namespace loom::data
