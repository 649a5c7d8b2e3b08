#include "loom/parallel/pipeline/gpt_chunks.hpp"

#include "loom/core/error.hpp"
#include "loom/models/gpt_flops.hpp"
#include "loom/parallel/pipeline/partition.hpp"

namespace loom::parallel::pipeline {

namespace {

std::string describe(const Schedule& schedule) {
  return str_cat("schedule '", schedule.name, "' (pp ", schedule.pp, " x ", schedule.virtual_stages,
                 " virtual stage(s) = ", schedule.chunks(), " chunks)");
}

void check_layer_count(const models::GPTConfig& config, const Schedule& schedule) {
  LOOM_CHECK(config.layers >= schedule.chunks(), "a GPT of ", config.layers,
             " layers cannot be cut into ", describe(schedule),
             ": it needs at least as many layers as chunks");
}

// The partition problem of a GPT's cut: one cost per block, the embeddings on
// the first chunk, the head on the last; those two may take no block. Ranks
// as the schedule places the chunks.
PartitionProblem flops_problem(const models::GPTConfig& config, const Schedule& schedule) {
  const models::GPTFlops flops = models::gpt_flops(config, 1, config.seq_len);
  const auto chunks = static_cast<size_t>(schedule.chunks());
  PartitionProblem p;
  p.layer_costs.assign(static_cast<size_t>(config.layers), flops.block.total());
  p.chunk_costs.assign(chunks, 0.0);
  p.chunk_costs.front() += flops.embeddings.total();
  p.chunk_costs.back() += flops.head.total();
  p.min_layers.assign(chunks, 1);
  p.min_layers.front() = 0;
  p.min_layers.back() = 0;
  for (const ChunkPlace& place : schedule.placement) p.chunk_ranks.push_back(place.rank);
  return p;
}

}  // namespace

std::vector<int64_t> even_gpt_chunk_layers(const models::GPTConfig& config,
                                           const Schedule& schedule) {
  check_layer_count(config, schedule);
  const int64_t chunks = schedule.chunks();
  std::vector<int64_t> out(static_cast<size_t>(chunks), config.layers / chunks);
  for (int64_t c = 0; c < config.layers % chunks; ++c) ++out[static_cast<size_t>(c)];
  return out;
}

std::vector<int64_t> gpt_chunk_layers(const models::GPTConfig& config, const Schedule& schedule,
                                      const std::vector<int64_t>& chunk_layers) {
  config.validate();
  check_layer_count(config, schedule);
  const int64_t chunks = schedule.chunks();
  if (chunk_layers.empty()) return balanced_partition(flops_problem(config, schedule));
  LOOM_CHECK(static_cast<int64_t>(chunk_layers.size()) == chunks,
             "layers per chunk: ", chunk_layers.size(), " entries given for ", describe(schedule),
             "; one per chunk");
  int64_t sum = 0;
  for (size_t c = 0; c < chunk_layers.size(); ++c) {
    const bool end = c == 0 || static_cast<int64_t>(c) == chunks - 1;
    LOOM_CHECK(chunk_layers[c] >= (end ? 0 : 1), "layers per chunk: chunk ", c, " gets ",
               chunk_layers[c],
               end ? "; a layer count cannot be negative"
                   : "; a chunk other than the first and the last needs at least one layer (only "
                     "the chunks holding the embeddings or the head may hold none)");
    sum += chunk_layers[c];
  }
  LOOM_CHECK(sum == config.layers, "layers per chunk sum to ", sum, " but the GPT has ",
             config.layers, " layers");
  return chunk_layers;
}

std::vector<double> gpt_chunk_flops(const models::GPTConfig& config, const Schedule& schedule,
                                    const std::vector<int64_t>& chunk_layers) {
  const std::vector<int64_t> cut = gpt_chunk_layers(config, schedule, chunk_layers);
  return partition_costs(flops_problem(config, schedule), cut);
}

std::vector<nn::Module*> GPTChunks::modules() const {
  std::vector<nn::Module*> out;
  for (const auto& wrapper : wrappers) out.push_back(wrapper.get());
  if (!out.empty()) return out;
  for (const auto& part : parts) out.push_back(part.get());
  return out;
}

std::vector<parallel::ShardedModule*> GPTChunks::shard_parameters() {
  LOOM_CHECK(wrappers.empty(),
             "GPT chunks: shard_parameters() was called already; each part "
             "and block takes one ShardedModule");
  std::vector<parallel::ShardedModule*> units;
  for (const auto& part : parts) {
    wrappers.push_back(std::make_unique<parallel::ShardedModule>(*part));
    units.push_back(wrappers.back().get());
    for (parallel::ShardedModule* block : parallel::shard_children(part->blocks())) {
      units.push_back(block);
    }
  }
  // A head tied to the table of the embeddings in another part on this rank
  // (ZB-V's rank 0): the table is the embeddings' part's parameter (the head
  // lists none), so the head's part gathers that part's parameters too.
  for (size_t j = 0; j < parts.size(); ++j) {
    models::GPTEnd* head = parts[j]->head();
    if (head == nullptr || head->owns_token_table() || parts[j]->embeddings() != nullptr) continue;
    bool found = false;
    for (size_t k = 0; k < parts.size(); ++k) {
      models::GPTEnd* embeddings = parts[k]->embeddings();
      if (embeddings != nullptr && &embeddings->token_table() == &head->token_table()) {
        wrappers[j]->gather_with(*wrappers[k]);
        found = true;
      }
    }
    LOOM_CHECK(found, "GPT chunks: the head of virtual stage ", j,
               " is tied to a token table that no part on this rank holds");
  }
  return units;
}

std::vector<nn::Parameter*> GPTChunks::parameters() const {
  std::vector<nn::Parameter*> out;
  for (const auto& part : parts) {
    for (nn::Parameter* p : part->parameters()) out.push_back(p);
  }
  return out;
}

GPTChunks build_gpt_chunks(const models::GPTConfig& config, const Schedule& schedule, int rank,
                           const std::vector<int64_t>& chunk_layers,
                           const models::GPTLayerFactory& layers) {
  config.validate();
  LOOM_CHECK(rank >= 0 && rank < schedule.pp, "GPT chunks: rank ", rank,
             " is not a pipeline rank of schedule '", schedule.name, "' (pp ", schedule.pp, ")");
  LOOM_CHECK(static_cast<int>(schedule.placement.size()) == schedule.chunks(),
             "GPT chunks: schedule '", schedule.name, "' places ", schedule.placement.size(),
             " chunks, not pp x virtual stages = ", schedule.chunks());
  const std::vector<int64_t> per_chunk = gpt_chunk_layers(config, schedule, chunk_layers);
  const int last = schedule.chunks() - 1;
  GPTChunks out;
  out.parts.resize(static_cast<size_t>(schedule.virtual_stages));
  nn::Parameter* table = nullptr;  // the embeddings' token table, when built on this rank
  int64_t first_block = 0;
  for (int c = 0; c <= last; ++c) {
    const int64_t end_block = first_block + per_chunk[static_cast<size_t>(c)];
    const ChunkPlace place = schedule.placement[static_cast<size_t>(c)];
    if (place.rank == rank) {
      LOOM_CHECK(place.virtual_stage >= 0 && place.virtual_stage < schedule.virtual_stages &&
                     out.parts[static_cast<size_t>(place.virtual_stage)] == nullptr,
                 "GPT chunks: schedule '", schedule.name, "' places chunk ", c,
                 " at virtual stage ", place.virtual_stage, " of rank ", rank,
                 ", which is out of range or taken");
      const models::GPTPartSpec spec{.first_block = first_block,
                                     .end_block = end_block,
                                     .embeddings = c == 0,
                                     .head = c == last};
      nn::Parameter* tie = spec.head && !spec.embeddings ? table : nullptr;
      auto part = std::make_unique<models::GPTPart>("", config, spec, layers, tie);
      if (spec.embeddings) table = part->token_table();
      out.parts[static_cast<size_t>(place.virtual_stage)] = std::move(part);
    }
    first_block = end_block;
  }
  return out;
}

}  // namespace loom::parallel::pipeline
