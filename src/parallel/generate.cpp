// Text generation with a GPT split over tp and pp ranks: the window through
// the stages, the last position's logits gathered and shared.
#include "loom/parallel/generate.hpp"

#include <algorithm>

#include "loom/core/error.hpp"
#include "loom/parallel/pipeline/forward_pass.hpp"
#include "loom/parallel/vocab_parallel.hpp"
#include "models/kv_cache.hpp"

namespace loom::parallel {

namespace {

// The pieces of `gpt` on this rank, checked.
std::vector<models::GPTPart*> pieces(const DistributedGPT& gpt) {
  const bool pipelined = gpt.schedule != nullptr;
  LOOM_CHECK(pipelined ? gpt.model == nullptr && gpt.pp != nullptr && !gpt.chunks.empty()
                       : gpt.model != nullptr && gpt.pp == nullptr && gpt.chunks.empty(),
             "parallel::generate: give either the whole model or a pipeline's schedule, pp "
             "group and chunks");
  std::vector<models::GPTPart*> parts = pipelined ? gpt.chunks : std::vector{gpt.model};
  for (const models::GPTPart* part : parts) {
    LOOM_CHECK(part != nullptr, "parallel::generate: a null chunk");
  }
  if (pipelined) {
    LOOM_CHECK(static_cast<int>(parts.size()) == gpt.schedule->virtual_stages,
               "parallel::generate: ", parts.size(), " chunks for the ",
               gpt.schedule->virtual_stages, " virtual stage(s) of schedule '", gpt.schedule->name,
               "'");
  } else {
    LOOM_CHECK(gpt.model->embeddings() != nullptr && gpt.model->head() != nullptr,
               "parallel::generate: without a pipeline the model must hold the whole GPT "
               "(embeddings to head)");
  }
  return parts;
}

// Rows `rows` of the logits the last stage's tp ranks hold ([B, R, columns]
// each, rows counted over B x R), their columns gathered over tp and the
// padding dropped, on every rank of the pp group.
std::vector<std::vector<float>> share_rows(const DistributedGPT& gpt,
                                           const models::GPTConfig& config, const Tensor& logits,
                                           std::span<const int64_t> rows, Device device) {
  const bool pipelined = gpt.schedule != nullptr;
  const int tp = gpt.tp != nullptr ? gpt.tp->group()->size() : 1;
  const int64_t columns = padded_vocab(config.vocab, tp) / tp;  // logits per tp rank
  const int last_rank = pipelined ? gpt.schedule->rank_of(gpt.schedule->chunks() - 1) : 0;
  const auto count = static_cast<int64_t>(rows.size());
  std::vector<float> out(static_cast<size_t>(count * config.vocab));
  if (!pipelined || gpt.pp->rank() == last_rank) {
    LOOM_CHECK(logits.dim() == 3 && logits.size(2) == columns,
               "parallel::generate: the head gave logits ", shape_str(logits.shape()),
               ", expected [*, *, ", columns, "]");
    std::vector<float> mine(static_cast<size_t>(count * columns));
    for (int64_t i = 0; i < count; ++i) {
      const int64_t row = rows[static_cast<size_t>(i)];
      LOOM_CHECK(row >= 0 && row < logits.size(0) * logits.size(1), "parallel::generate: row ", row,
                 " of logits ", shape_str(logits.shape()));
      const std::vector<float> values =
          logits.flat_view(row * columns, {columns}).to(DType::f32).to_vector<float>();
      std::copy(values.begin(), values.end(), mine.begin() + i * columns);
    }
    // Gathered over tp: rank t's block holds its columns of every row.
    std::vector<float> gathered = mine;
    if (tp > 1) {
      const Tensor part = Tensor::from_vector(mine, {count * columns}, device);
      Tensor all = Tensor::empty({tp * count * columns}, DType::f32, device);
      gpt.tp->group()->all_gather(part, all).wait();
      gathered = all.to_vector<float>();
    }
    for (int64_t i = 0; i < count; ++i) {
      for (int t = 0; t < tp; ++t) {
        const int64_t first = t * columns;  // of the padded vocabulary
        const int64_t kept = std::clamp<int64_t>(config.vocab - first, 0, columns);
        std::copy_n(gathered.begin() + (t * count + i) * columns, kept,
                    out.begin() + i * config.vocab + first);
      }
    }
  }
  if (pipelined) {
    Tensor shared = Tensor::from_vector(out, {count * config.vocab}, device);
    gpt.pp->broadcast(shared, {.root = last_rank}).wait();
    out = shared.to_vector<float>();
  }
  std::vector<std::vector<float>> split(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    split[static_cast<size_t>(i)].assign(out.begin() + i * config.vocab,
                                         out.begin() + (i + 1) * config.vocab);
  }
  return split;
}

std::vector<float> share_row(const DistributedGPT& gpt, const models::GPTConfig& config,
                             const Tensor& logits, int64_t row, Device device) {
  const int64_t rows[] = {row};
  return std::move(share_rows(gpt, config, logits, rows, device).front());
}

Device device_of(const std::vector<models::GPTPart*>& parts) {
  return parts.front()->parameters().front()->value().device();
}

// Each part's key/value cache (NOTE [cached generation]), or none when some
// rank of the tp × pp group cannot keep one for all its parts: every rank
// then reruns the window, as every rank must take the same path.
std::vector<models::KvCache> caches_for(const DistributedGPT& gpt,
                                        const std::vector<models::GPTPart*>& parts,
                                        int64_t sequences = 1) {
  std::vector<models::KvCache> caches;
  for (models::GPTPart* part : parts) {
    std::optional<models::KvCache> cache = models::KvCache::for_part(*part, sequences);
    if (!cache) break;
    caches.push_back(std::move(*cache));
  }
  Tensor usable = Tensor::from_vector(std::vector<int32_t>{caches.size() == parts.size() ? 1 : 0},
                                      {1}, device_of(parts));
  if (gpt.tp != nullptr) gpt.tp->group()->all_reduce(usable, {.op = comm::ReduceOp::min}).wait();
  if (gpt.pp != nullptr) gpt.pp->all_reduce(usable, {.op = comm::ReduceOp::min}).wait();
  if (usable.to(Device::cpu()).item<int32_t>() == 0) caches.clear();
  return caches;
}

}  // namespace

std::vector<float> next_token_logits(const DistributedGPT& gpt, std::span<const int32_t> ids) {
  const std::vector<models::GPTPart*> parts = pieces(gpt);
  const models::GPTConfig& config = parts.front()->config();
  LOOM_CHECK(!ids.empty(), "parallel::next_token_logits: no ids");
  const int tp = gpt.tp != nullptr ? gpt.tp->group()->size() : 1;
  const bool sequence_parallel = gpt.tp != nullptr && gpt.tp->options().sequence_parallel;
  const Device device = device_of(parts);

  const std::span<const int32_t> window = models::generation_window(ids, config.seq_len);
  const auto length = static_cast<int64_t>(window.size());
  // Under SP every rank keeps 1/tp of the positions: ids after the window
  // fill it to a multiple of tp (seq_len is one), and causal attention keeps
  // them out of the positions before them.
  const int64_t padded = sequence_parallel ? (length + tp - 1) / tp * tp : length;
  std::vector<int32_t> input_ids(window.begin(), window.end());
  input_ids.resize(static_cast<size_t>(padded), 0);
  const Tensor input = Tensor::from_vector(input_ids, {1, padded}, device);
  // The head projects the last position alone, as on one rank; under SP
  // each rank holds a slice of the positions, which the head gathers.
  const int64_t last = sequence_parallel ? -1 : length - 1;
  const auto run = [&](int stage, const Tensor& x) {
    return models::generation_forward(*parts[static_cast<size_t>(stage)], x, last);
  };
  const Tensor logits = gpt.schedule != nullptr ? pipeline::forward_through_stages(
                                                      *gpt.schedule, *gpt.pp, run, input, device)
                                                : run(0, input);
  return share_row(gpt, config, logits, sequence_parallel ? length - 1 : 0, device);
}

// The rows after those `caches` hold for sequence `sequence` through the
// stages (under SP padded to a multiple of tp), and their last real row's
// logits on every rank.
std::vector<float> feed_through(const DistributedGPT& gpt, std::vector<models::KvCache>& caches,
                                std::span<const int32_t> ids, int64_t sequence) {
  const std::vector<models::GPTPart*> parts = pieces(gpt);
  const models::GPTConfig& config = parts.front()->config();
  const Device device = device_of(parts);
  const int tp = gpt.tp != nullptr ? gpt.tp->group()->size() : 1;
  const bool sequence_parallel = gpt.tp != nullptr && gpt.tp->options().sequence_parallel;
  const std::span<const int32_t> added =
      ids.subspan(static_cast<size_t>(caches[0].length(sequence)));
  const auto rows = static_cast<int64_t>(added.size());
  std::vector<int32_t> input_ids(added.begin(), added.end());
  input_ids.resize(static_cast<size_t>(sequence_parallel ? (rows + tp - 1) / tp * tp : rows), 0);
  const Tensor input =
      Tensor::from_vector(input_ids, {1, static_cast<int64_t>(input_ids.size())}, device);
  const auto run = [&](int stage, const Tensor& x) {
    return caches[static_cast<size_t>(stage)].feed(x, rows, sequence);
  };
  const Tensor logits = gpt.schedule != nullptr ? pipeline::forward_through_stages(
                                                      *gpt.schedule, *gpt.pp, run, input, device)
                                                : run(0, input);
  return share_row(gpt, config, logits, 0, device);
}

std::vector<int32_t> generate(const DistributedGPT& gpt, std::vector<int32_t> prompt,
                              const models::GenerateOptions& options,
                              const std::function<bool(int32_t)>& on_token) {
  const std::vector<models::GPTPart*> parts = pieces(gpt);
  const models::GPTConfig& config = parts.front()->config();
  models::check_generate_inputs(config, prompt, options);
  std::vector<models::KvCache> caches;
  if (options.use_cache) caches = caches_for(gpt, parts);
  // While the window starts at position 0: the new ids through the caches.
  const models::NextTokenLogits next_logits = [&](std::span<const int32_t> ids) {
    if (caches.empty() || static_cast<int64_t>(ids.size()) > config.seq_len) {
      return next_token_logits(gpt, ids);
    }
    return feed_through(gpt, caches, ids, 0);
  };

  const models::GenerationScope scope(std::vector<nn::Module*>(parts.begin(), parts.end()));
  return models::generate_with(next_logits, config, std::move(prompt), options, on_token);
}

std::vector<std::vector<int32_t>> generate_batch(
    const DistributedGPT& gpt, std::vector<std::vector<int32_t>> prompts,
    const models::GenerateOptions& options, const std::function<bool(size_t, int32_t)>& on_token) {
  const std::vector<models::GPTPart*> parts = pieces(gpt);
  const models::GPTConfig& config = parts.front()->config();
  models::check_generate_inputs(config, prompts, options);
  const Device device = device_of(parts);
  const bool sequence_parallel = gpt.tp != nullptr && gpt.tp->options().sequence_parallel;
  std::vector<models::KvCache> caches;
  if (options.use_cache) caches = caches_for(gpt, parts, static_cast<int64_t>(prompts.size()));
  // NOTE [batched generation]: every rank holds the same ids, so every rank
  // picks the same path for each sequence.
  const models::NextTokenLogitsBatch next_logits = [&](const std::vector<std::vector<int32_t>>& ids,
                                                       std::span<const size_t> active) {
    std::vector<std::vector<float>> out(active.size());
    const models::BatchStep plan = models::plan_batch_step(
        ids, active, caches.empty() ? nullptr : &caches[0], config.seq_len, !sequence_parallel);
    for (const size_t i : plan.rerun) out[i] = next_token_logits(gpt, ids[active[i]]);
    for (const size_t i : plan.feed) {
      out[i] = feed_through(gpt, caches, ids[active[i]], static_cast<int64_t>(active[i]));
    }
    for (const auto& [i, j] : plan.copy) {  // each rank its own parts' caches
      for (models::KvCache& cache : caches) {
        cache.copy_sequence(static_cast<int64_t>(active[j]), static_cast<int64_t>(active[i]));
      }
      out[i] = out[j];
    }
    const std::vector<size_t>& stepping = plan.step;
    if (!stepping.empty()) {
      std::vector<int32_t> last;
      std::vector<int64_t> sequences, rows;
      for (const size_t i : stepping) {
        last.push_back(ids[active[i]].back());
        sequences.push_back(static_cast<int64_t>(active[i]));
        rows.push_back(static_cast<int64_t>(rows.size()));
      }
      const Tensor input =
          Tensor::from_vector(last, {static_cast<int64_t>(last.size()), 1}, device);
      const auto run = [&](int stage, const Tensor& x) {
        return caches[static_cast<size_t>(stage)].step(x, sequences);
      };
      const Tensor logits =
          gpt.schedule != nullptr
              ? pipeline::forward_through_stages(*gpt.schedule, *gpt.pp, run, input, device)
              : run(0, input);
      std::vector<std::vector<float>> shared = share_rows(gpt, config, logits, rows, device);
      for (size_t r = 0; r < stepping.size(); ++r) out[stepping[r]] = std::move(shared[r]);
    }
    return out;
  };
  const models::GenerationScope scope(std::vector<nn::Module*>(parts.begin(), parts.end()));
  return models::generate_batch_with(next_logits, config, std::move(prompts), options, on_token);
}

}  // namespace loom::parallel
