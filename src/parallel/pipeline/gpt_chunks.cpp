#include "loom/parallel/pipeline/gpt_chunks.hpp"

#include "loom/core/error.hpp"

namespace loom::parallel::pipeline {

std::vector<int64_t> gpt_chunk_layers(const models::GPTConfig& config, const Schedule& schedule,
                                      const std::vector<int64_t>& chunk_layers) {
  const int64_t chunks = schedule.chunks();
  const std::string what =
      str_cat("schedule '", schedule.name, "' (pp ", schedule.pp, " x ", schedule.virtual_stages,
              " virtual stage(s) = ", chunks, " chunks)");
  if (chunk_layers.empty()) {
    LOOM_CHECK(config.layers >= chunks, "a GPT of ", config.layers, " layers cannot be cut into ",
               what, ": every chunk needs at least one layer");
    std::vector<int64_t> out(static_cast<size_t>(chunks), config.layers / chunks);
    for (int64_t c = 0; c < config.layers % chunks; ++c) ++out[static_cast<size_t>(c)];
    return out;
  }
  LOOM_CHECK(static_cast<int64_t>(chunk_layers.size()) == chunks,
             "layers per chunk: ", chunk_layers.size(), " entries given for ", what,
             "; one per chunk");
  int64_t sum = 0;
  for (size_t c = 0; c < chunk_layers.size(); ++c) {
    LOOM_CHECK(chunk_layers[c] >= 1, "layers per chunk: chunk ", c, " gets ", chunk_layers[c],
               "; every chunk needs at least one layer");
    sum += chunk_layers[c];
  }
  LOOM_CHECK(sum == config.layers, "layers per chunk sum to ", sum, " but the GPT has ",
             config.layers, " layers");
  return chunk_layers;
}

std::vector<nn::Module*> GPTChunks::modules() const {
  std::vector<nn::Module*> out;
  for (const auto& part : parts) out.push_back(part.get());
  return out;
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
