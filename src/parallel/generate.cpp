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

// Row `row` of the logits the last stage's tp ranks hold ([1, rows, columns]
// each), its columns gathered over tp and the padding dropped, on every rank
// of the pp group.
std::vector<float> share_row(const DistributedGPT& gpt, const models::GPTConfig& config,
                             const Tensor& logits, int64_t row, Device device) {
  const bool pipelined = gpt.schedule != nullptr;
  const int tp = gpt.tp != nullptr ? gpt.tp->group()->size() : 1;
  const int64_t columns = padded_vocab(config.vocab, tp) / tp;  // logits per tp rank
  const int last_rank = pipelined ? gpt.schedule->rank_of(gpt.schedule->chunks() - 1) : 0;
  std::vector<float> out(static_cast<size_t>(config.vocab));
  if (!pipelined || gpt.pp->rank() == last_rank) {
    LOOM_CHECK(logits.dim() == 3 && logits.size(0) == 1 && row < logits.size(1) &&
                   logits.size(2) == columns,
               "parallel::generate: the head gave logits ", shape_str(logits.shape()),
               ", expected [1, > ", row, ", ", columns, "]");
    Tensor mine = logits.flat_view(row * columns, {columns}).to(DType::f32);
    if (tp > 1) {
      Tensor all = Tensor::empty({tp * columns}, DType::f32, mine.device());
      gpt.tp->group()->all_gather(mine, all).wait();
      mine = all;
    }
    const std::vector<float> gathered = mine.to_vector<float>();
    std::copy_n(gathered.begin(), config.vocab, out.begin());
  }
  if (pipelined) {
    Tensor shared = Tensor::from_vector(out, {config.vocab}, device);
    gpt.pp->broadcast(shared, {.root = last_rank}).wait();
    return shared.to_vector<float>();
  }
  return out;
}

Device device_of(const std::vector<models::GPTPart*>& parts) {
  return parts.front()->parameters().front()->value().device();
}

// Each part's key/value cache (NOTE [cached generation]), or none when some
// rank of the tp × pp group cannot keep one for all its parts: every rank
// then reruns the window, as every rank must take the same path.
std::vector<models::KvCache> caches_for(const DistributedGPT& gpt,
                                        const std::vector<models::GPTPart*>& parts) {
  std::vector<models::KvCache> caches;
  for (models::GPTPart* part : parts) {
    std::optional<models::KvCache> cache = models::KvCache::for_part(*part);
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

std::vector<int32_t> generate(const DistributedGPT& gpt, std::vector<int32_t> prompt,
                              const models::GenerateOptions& options,
                              const std::function<bool(int32_t)>& on_token) {
  const std::vector<models::GPTPart*> parts = pieces(gpt);
  const models::GPTConfig& config = parts.front()->config();
  models::check_generate_inputs(config, prompt, options);
  const Device device = device_of(parts);
  const int tp = gpt.tp != nullptr ? gpt.tp->group()->size() : 1;
  const bool sequence_parallel = gpt.tp != nullptr && gpt.tp->options().sequence_parallel;
  std::vector<models::KvCache> caches;
  if (options.use_cache) caches = caches_for(gpt, parts);
  // While the window starts at position 0: the new ids through the caches.
  const models::NextTokenLogits next_logits = [&](std::span<const int32_t> ids) {
    if (caches.empty() || static_cast<int64_t>(ids.size()) > config.seq_len) {
      return next_token_logits(gpt, ids);
    }
    const std::span<const int32_t> added = ids.subspan(static_cast<size_t>(caches[0].length()));
    // Under SP the new ids padded to a multiple of tp (the cache drops the padding).
    const auto rows = static_cast<int64_t>(added.size());
    std::vector<int32_t> input_ids(added.begin(), added.end());
    input_ids.resize(static_cast<size_t>(sequence_parallel ? (rows + tp - 1) / tp * tp : rows), 0);
    const Tensor input =
        Tensor::from_vector(input_ids, {1, static_cast<int64_t>(input_ids.size())}, device);
    const auto run = [&](int stage, const Tensor& x) {
      return caches[static_cast<size_t>(stage)].feed(x, rows);
    };
    const Tensor logits = gpt.schedule != nullptr ? pipeline::forward_through_stages(
                                                        *gpt.schedule, *gpt.pp, run, input, device)
                                                  : run(0, input);
    return share_row(gpt, config, logits, 0, device);
  };

  const models::GenerationScope scope(std::vector<nn::Module*>(parts.begin(), parts.end()));
  return models::generate_with(next_logits, config, std::move(prompt), options, on_token);
}

}  // namespace loom::parallel
