// The small GPT that multi-rank tests train: 61 tokens (prime: no tp divides
// the vocabulary, so the padding path runs), 2 blocks of width 32, 4 heads,
// sequences of 16, seed 7. A few milliseconds per step on one core.
#pragma once

#include <cstdint>

#include "loom/models/gpt_config.hpp"

namespace loom::test {

inline models::GPTConfig small_gpt(int64_t d_model = 32, int64_t layers = 2) {
  models::GPTConfig c;
  c.vocab = 61;
  c.layers = layers;
  c.d_model = d_model;
  c.heads = 4;
  c.seq_len = 16;
  c.module.seed = 7;
  return c;
}

}  // namespace loom::test
