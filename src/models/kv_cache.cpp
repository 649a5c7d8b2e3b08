// The key/value cache of cached generation.
#include "models/kv_cache.hpp"

#include <algorithm>
#include <cmath>

#include "loom/core/error.hpp"
#include "loom/core/half.hpp"
#include "loom/nn/evaluation.hpp"

namespace loom::models {

// NOTE [cached generation]
// While the window still starts at position 0 (no more ids than seq_len), a
// new token's logits need only its own row through every layer that works
// row by row (LayerNorm, the linear layers, the MLP branch, the head) and, in
// attention, its own query against the keys and values of every position so
// far, which appending tokens does not change. KvCache keeps those keys and
// values per block and runs the part's own modules on the new rows alone;
// the first rows (the prompt) go through the part's own attention too, later
// ones attend over the cache here, in f32 on the host. Once
// the window slides every position moves, the cache no longer holds, and the
// generation loop reruns the window for each further token.
//
// Under reduced precision the modules round their operands as they do in
// the model; the attention here follows NOTE [attention precision]: with
// 16-bit q, k and v (c_attn writes them so under bf16) the scores and the
// softmax are f32, the probabilities are rounded to 16 bits before P V and
// the output once from its f32 sum, so the cached tokens see the numbers the
// rerun window computes up to summation order and the exponential's last
// bit.
//
// The modules may be tensor-parallel shards: c_attn then gives this rank's
// heads' q, k and v (its width / 3 columns each, which fixes the heads it
// holds), c_proj and the MLP's second product sum over tp, and the embeddings
// and the head are vocabulary-parallel (the caller gathers the head's
// columns).
//
// Under sequence parallelism every layer outside the products takes 1/tp of
// the rows: the caller pads the new rows to a multiple of tp (feed's
// new_rows says how many are real), each rank's LayerNorms, residual adds
// and MLP work on its slice, c_attn gathers every row for the rank's heads
// (so each rank caches every position's keys and values of its heads),
// c_proj reduce-scatters them back, and the head gathers the rows again.
// Padding rows are neither cached nor attended from; whatever they compute
// is dropped.
//
// NOTE [batched generation]
// A cache may hold several sequences, each with its own keys, values and
// length. A prompt (or any several rows) goes through feed() one sequence at
// a time, since the sequences' lengths differ and the model's attention
// takes one causal sequence; after it, step() takes one new row of each of
// several sequences as one batch [A, 1] through every row-wise layer
// (LayerNorm, the products, the MLP, the head), so a token of A sequences
// reads each weight once instead of A times, and only the attention runs per
// sequence, over its own cache. Under sequence parallelism a single row
// cannot be split over the ranks: there every sequence goes through feed()
// alone. Sequences with the same prompt (several samples of one prompt) feed
// it once: the others copy its keys and values (copy_sequence) and take its
// logits.

namespace {

// `value` rounded to `dtype` (f32: as it is).
float rounded_to(DType dtype, float value) {
  switch (dtype) {
    case DType::bf16:
      return static_cast<float>(bfloat16(value));
    case DType::f16:
      return static_cast<float>(float16(value));
    default:
      return value;
  }
}

// q . k over n floats, summed in 16 independent lanes, which the compiler
// vectorises (one running sum it may not reorder), then across the lanes.
float dot(const float* q, const float* k, int64_t n) {
  constexpr int kLanes = 16;
  float lanes[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int l = 0; l < kLanes; ++l) lanes[l] += q[j + l] * k[j + l];
  }
  float sum = 0;
  for (; j < n; ++j) sum += q[j] * k[j];
  for (const float lane : lanes) sum += lane;
  return sum;
}

// One new row's attention for every head of this rank: its queries q (heads
// x hd floats) over the `seen` positions of `keys` and `values` ([seen,
// width]), softmax in f32, the probabilities rounded to `rounding` before
// P V; adds into `out` (width floats, zero on entry).
void attend_row(const float* q, const std::vector<float>& keys, const std::vector<float>& values,
                int64_t seen, int64_t width, int64_t hd, DType rounding, float* out,
                std::vector<float>& scores) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  scores.resize(static_cast<size_t>(seen));
  for (int64_t head = 0; head < width / hd; ++head) {
    const float* qh = q + head * hd;
    float top = -INFINITY;
    for (int64_t t = 0; t < seen; ++t) {
      scores[t] = dot(qh, keys.data() + t * width + head * hd, hd) * scale;
      top = std::max(top, scores[t]);
    }
    float sum = 0;
    for (int64_t t = 0; t < seen; ++t) sum += scores[t] = std::exp(scores[t] - top);
    float* o = out + head * hd;
    for (int64_t t = 0; t < seen; ++t) {
      const float p = rounded_to(rounding, scores[t] / sum);
      const float* v = values.data() + t * width + head * hd;
      for (int64_t j = 0; j < hd; ++j) o[j] += p * v[j];
    }
  }
}

nn::Module* child_named(nn::Module& parent, const std::string& name) {
  for (nn::Module* child : parent.children()) {
    if (child->name() == name) return child;
  }
  return nullptr;
}

}  // namespace

Tensor generation_forward(GPTPart& part, const Tensor& input, int64_t last_row) {
  Tensor x = part.embeddings() != nullptr ? nn::infer(*part.embeddings(), input) : input;
  x = nn::infer(part.blocks(), x);
  if (part.head() == nullptr) return x;
  if (last_row >= 0) {
    const int64_t d = part.config().d_model;
    x = x.flat_view(last_row * d, {1, 1, d});
  }
  return nn::infer(*part.head(), x);
}

GenerationScope::GenerationScope(std::vector<nn::Module*> modules) : modules_(std::move(modules)) {
  int64_t weight_bytes = 0;
  for (nn::Module* module : modules_) {
    was_training_.push_back(module->training());
    module->set_training(false);
    for (const nn::Parameter* p : module->parameters()) {
      weight_bytes += static_cast<int64_t>(p->value().nbytes());
    }
  }
  // Room for every weight packed (its f32 panels, or a 16-bit copy and its panels).
  packed_.emplace(weight_bytes + weight_bytes / 4 + (int64_t{16} << 20));
}

GenerationScope::~GenerationScope() {
  for (size_t i = 0; i < modules_.size(); ++i) modules_[i]->set_training(was_training_[i]);
}

std::optional<KvCache> KvCache::for_part(GPTPart& part, int64_t sequences) {
  LOOM_CHECK(sequences >= 1, "KvCache: ", sequences, " sequences (at least 1)");
  const GPTConfig& config = part.config();
  if (config.checkpoint_blocks || part.parameters().front()->value().device() != Device::cpu()) {
    return std::nullopt;
  }
  KvCache cache;
  cache.part_ = &part;
  if (part.embeddings() != nullptr) {
    cache.embeddings_ = dynamic_cast<GPTEmbeddings*>(part.embeddings());
    if (cache.embeddings_ == nullptr) return std::nullopt;
  }
  const std::vector<nn::Module*> blocks = part.blocks().children();
  const int64_t first = part.spec().first_block;
  for (int64_t i = 0; i < static_cast<int64_t>(blocks.size()); ++i) {
    const std::string h = str_cat(part.name().empty() ? "" : part.name() + ".", "h.", first + i);
    // A wrapper of the same name (ZeRO stage 3's parallel::ShardedModule,
    // whose parameters the caller has gathered) holds the block as its one child.
    nn::Module* inner = blocks[i];
    while (inner->children().size() == 1 && inner->children().front()->name() == inner->name()) {
      inner = inner->children().front();
    }
    nn::Module* attn_residual = child_named(*inner, h + ".attn_residual");
    Block block;
    block.mlp_residual = child_named(*inner, h + ".mlp_residual");
    if (attn_residual == nullptr || block.mlp_residual == nullptr ||
        attn_residual->children().size() != 1) {
      return std::nullopt;
    }
    nn::Module& branch = *attn_residual->children().front();
    block.ln_1 = child_named(branch, h + ".ln_1");
    block.c_attn = child_named(branch, h + ".attn.c_attn");
    block.c_proj = child_named(branch, h + ".attn.c_proj");
    block.core = child_named(branch, h + ".attn.core");
    if (block.core == nullptr) block.core = child_named(branch, h + ".attn.core.checkpoint");
    if (block.ln_1 == nullptr || block.c_attn == nullptr || block.core == nullptr ||
        block.c_proj == nullptr) {
      return std::nullopt;
    }
    block.keys.resize(static_cast<size_t>(sequences));
    block.values.resize(static_cast<size_t>(sequences));
    cache.blocks_.push_back(std::move(block));
  }
  cache.lengths_.assign(static_cast<size_t>(sequences), 0);
  return cache;
}

Tensor KvCache::finish_block(const Block& block, const Tensor& x, const Tensor& attention) {
  // Under SP c_proj reduce-scatters the rows back to this rank's.
  const Tensor y = nn::infer(*block.c_proj, attention);
  std::vector<float> sum = x.to_vector<float>();
  const std::vector<float> branch = y.to_vector<float>();
  for (size_t i = 0; i < sum.size(); ++i) sum[i] += branch[i];
  return nn::infer(*block.mlp_residual, Tensor::from_vector(sum, x.shape()));
}

Tensor KvCache::feed(const Tensor& input, int64_t new_rows, int64_t sequence) {
  const GPTConfig& config = part_->config();
  const int64_t d = config.d_model, hd = d / config.heads;
  LOOM_CHECK(sequence >= 0 && sequence < sequences(), "KvCache: sequence ", sequence,
             " of a cache for ", sequences());
  const auto s = static_cast<size_t>(sequence);
  int64_t& length = lengths_[s];
  Tensor x;
  if (embeddings_ != nullptr) {
    LOOM_CHECK(input.dim() == 2 && input.size(0) == 1,
               "KvCache: ids [1, n] enter a part with the embeddings; got ", input.str());
    x = embeddings_->embed_at(input, length);
  } else {
    LOOM_CHECK(input.dim() == 3 && input.size(0) == 1 && input.size(2) == d,
               "KvCache: activations [1, n, ", d, "] enter a part without the embeddings; got ",
               input.str());
    x = input;
  }
  const int64_t rows = x.size(1);  // this rank's: 1/tp of the new rows under SP
  std::vector<float> attended, scores;
  int64_t n = new_rows;  // the new rows that are not padding
  for (Block& block : blocks_) {
    // Under SP c_attn gathers the rows: every rank sees all of them, for its heads.
    const Tensor qkv_out = nn::infer(*block.c_attn, nn::infer(*block.ln_1, x));
    const DType rounding = qkv_out.dtype();  // what P and the output are rounded to
    const Tensor qkv = qkv_out.to(DType::f32);
    const int64_t all = qkv.size(1);
    if (n < 0) n = all;
    LOOM_CHECK(n >= 1 && n <= all && length + n <= config.seq_len, "KvCache: ", n, " new rows of ",
               all, " after ", length, " do not fit seq_len ", config.seq_len);
    // This rank's heads: all of them on one rank, heads / tp under tp.
    const int64_t width = qkv.size(2) / 3;
    LOOM_ASSERT(width * 3 == qkv.size(2) && width % hd == 0);
    std::vector<float>& keys = block.keys[s];
    std::vector<float>& values = block.values[s];
    const float* row = qkv.data<float>();
    for (int64_t r = 0; r < n; ++r) {
      keys.insert(keys.end(), row + r * 3 * width + width, row + r * 3 * width + 2 * width);
      values.insert(values.end(), row + r * 3 * width + 2 * width, row + (r + 1) * 3 * width);
    }
    Tensor attention;
    if (length == 0) {
      // The first rows (the prompt): the model's own attention over them, as
      // the rerun window computes it (padding rows come last, so causal
      // attention keeps them from the real ones).
      attention = nn::infer(*block.core, qkv_out);
    } else {
      // Each new row (position length + r) over positions 0 .. itself;
      // padding rows attend to nothing (zeros).
      attended.assign(static_cast<size_t>(all * width), 0.0f);
      for (int64_t r = 0; r < n; ++r) {
        attend_row(row + r * 3 * width, keys, values, length + r + 1, width, hd, rounding,
                   attended.data() + r * width, scores);
      }
      if (rounding != DType::f32) {
        for (float& value : attended) value = rounded_to(rounding, value);
      }
      attention = Tensor::from_vector(attended, {1, all, width});
    }
    x = finish_block(block, x, attention);
  }
  if (n < 0) n = rows;  // a part without blocks
  length += n;
  if (part_->head() == nullptr) return x;
  // The logits of the last new row: project it alone, or, where this rank
  // holds a slice of the rows (SP), all of them (the head gathers them).
  if (rows == n) {
    return nn::infer(*part_->head(), x.flat_view((n - 1) * d, {1, 1, d})).to(DType::f32);
  }
  const Tensor logits = nn::infer(*part_->head(), x);
  const int64_t columns = logits.size(2);
  return logits.flat_view((n - 1) * columns, {1, 1, columns}).to(DType::f32);
}

void KvCache::copy_sequence(int64_t from, int64_t to) {
  LOOM_CHECK(from >= 0 && from < sequences() && to >= 0 && to < sequences() && from != to,
             "KvCache::copy_sequence: sequences ", from, " and ", to, " of a cache for ",
             sequences());
  LOOM_CHECK(lengths_[static_cast<size_t>(to)] == 0, "KvCache::copy_sequence: sequence ", to,
             " has seen ", lengths_[static_cast<size_t>(to)], " positions already");
  for (Block& block : blocks_) {
    block.keys[static_cast<size_t>(to)] = block.keys[static_cast<size_t>(from)];
    block.values[static_cast<size_t>(to)] = block.values[static_cast<size_t>(from)];
  }
  lengths_[static_cast<size_t>(to)] = lengths_[static_cast<size_t>(from)];
}

Tensor KvCache::step(const Tensor& input, std::span<const int64_t> sequences) {
  const GPTConfig& config = part_->config();
  const int64_t d = config.d_model, hd = d / config.heads;
  const auto batch = static_cast<int64_t>(sequences.size());
  LOOM_CHECK(batch >= 1, "KvCache::step: no sequence");
  std::vector<int64_t> positions(sequences.size());
  std::vector<bool> seen_sequence(lengths_.size(), false);
  for (size_t a = 0; a < sequences.size(); ++a) {
    const int64_t q = sequences[a];
    LOOM_CHECK(q >= 0 && q < this->sequences(), "KvCache::step: sequence ", q, " of a cache for ",
               this->sequences());
    LOOM_CHECK(!seen_sequence[static_cast<size_t>(q)], "KvCache::step: sequence ", q, " twice");
    seen_sequence[static_cast<size_t>(q)] = true;
    positions[a] = lengths_[static_cast<size_t>(q)];
    LOOM_CHECK(positions[a] >= 1 && positions[a] < config.seq_len, "KvCache::step: sequence ", q,
               " has ", positions[a], " positions; a step needs at least 1 and adds one within ",
               "seq_len ", config.seq_len);
  }
  Tensor x;
  if (embeddings_ != nullptr) {
    x = embeddings_->embed_rows(input, positions);
  } else {
    LOOM_CHECK(
        input.dim() == 3 && input.size(0) == batch && input.size(1) == 1 && input.size(2) == d,
        "KvCache::step: activations [", batch, ", 1, ", d,
        "] enter a part without the embeddings; got ", input.str());
    x = input;
  }
  std::vector<float> attended, scores;
  for (Block& block : blocks_) {
    const Tensor qkv_out = nn::infer(*block.c_attn, nn::infer(*block.ln_1, x));
    const DType rounding = qkv_out.dtype();
    const Tensor qkv = qkv_out.to(DType::f32);
    LOOM_CHECK(qkv.size(0) == batch && qkv.size(1) == 1, "KvCache::step: c_attn gave ", qkv.str(),
               " for ", batch, " rows (sequence parallelism cannot split one row)");
    const int64_t width = qkv.size(2) / 3;
    LOOM_ASSERT(width * 3 == qkv.size(2) && width % hd == 0);
    const float* rows = qkv.data<float>();
    attended.assign(static_cast<size_t>(batch * width), 0.0f);
    for (int64_t a = 0; a < batch; ++a) {
      const auto q = static_cast<size_t>(sequences[static_cast<size_t>(a)]);
      const float* row = rows + a * 3 * width;
      block.keys[q].insert(block.keys[q].end(), row + width, row + 2 * width);
      block.values[q].insert(block.values[q].end(), row + 2 * width, row + 3 * width);
      attend_row(row, block.keys[q], block.values[q], positions[static_cast<size_t>(a)] + 1, width,
                 hd, rounding, attended.data() + a * width, scores);
    }
    if (rounding != DType::f32) {
      for (float& value : attended) value = rounded_to(rounding, value);
    }
    x = finish_block(block, x, Tensor::from_vector(attended, {batch, 1, width}));
  }
  for (const int64_t q : sequences) ++lengths_[static_cast<size_t>(q)];
  if (part_->head() == nullptr) return x;
  return nn::infer(*part_->head(), x).to(DType::f32);
}

BatchStep plan_batch_step(const std::vector<std::vector<int32_t>>& ids,
                          std::span<const size_t> active, const KvCache* cache, int64_t seq_len,
                          bool can_step) {
  BatchStep plan;
  for (size_t i = 0; i < active.size(); ++i) {
    const std::vector<int32_t>& seq = ids[active[i]];
    const auto n = static_cast<int64_t>(seq.size());
    if (cache == nullptr || n > seq_len) {
      plan.rerun.push_back(i);
      continue;
    }
    const int64_t seen = cache->length(static_cast<int64_t>(active[i]));
    if (can_step && seen > 0 && seen == n - 1) {
      plan.step.push_back(i);
      continue;
    }
    if (seen == 0) {
      const auto same = std::find_if(plan.feed.begin(), plan.feed.end(), [&](size_t j) {
        return cache->length(static_cast<int64_t>(active[j])) == 0 && ids[active[j]] == seq;
      });
      if (same != plan.feed.end()) {
        plan.copy.emplace_back(i, *same);
        continue;
      }
    }
    plan.feed.push_back(i);
  }
  return plan;
}

}  // namespace loom::models
