// The activation bytes predicted from the config (models/gpt_memory.hpp)
// against what the real pieces keep: the host allocator's live bytes before and
// after each piece's forward, its tape and output kept alive (NOTE [activation
// bytes convention]), as bench/pipeline_bench_worker.cpp measures a chunk.
//
// Exact: the allocator's requested_bytes are the tensors' own sizes, and
// every figure must equal them. allocated_bytes (what the benchmark reads)
// round each live block up to 64 bytes, or to 4 KiB pages from 1 MiB; a piece
// keeps at most 17 tensors (a bf16 block: 4 LayerNorm statistics, 4 Linear
// inputs, q | k | v, the probabilities, the pre-activation, 4 weight copies and
// 2 residual sums), so they lie less than 17 x 4 KiB above.
//
// Every run first does a forward it throws away: it makes what a module caches
// across micro-batches (GPTEmbeddings' position ids, an open
// PackedWeightScope's copies), which is not an activation.
//
// Tensor parallelism runs on the in-process backend, whose ranks are threads
// sharing one host allocator: the pieces run in step (a std::barrier around
// each reading) and a delta is the sum over the ranks, which hold equal shapes
// (the padded vocabulary splits evenly), so it must equal tp times one rank's
// figure.
#include <catch2/catch.hpp>

#include <barrier>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "loom/comm/local.hpp"
#include "loom/core/allocator.hpp"
#include "loom/kernels/gemm.hpp"
#include "loom/models/gpt.hpp"
#include "loom/models/gpt_memory.hpp"
#include "loom/nn/cross_entropy_loss.hpp"
#include "loom/nn/precision.hpp"
#include "loom/parallel/tensor_parallel_gpt.hpp"
#include "loom/parallel/vocab_parallel.hpp"

using namespace loom;
using Catch::Matchers::Contains;
using models::GPTActivationBytes;
using models::GPTConfig;

namespace {

// The host allocator's live bytes, or a difference of them.
struct Live {
  double requested = 0;  // the tensors' sizes
  double allocated = 0;  // rounded up per block

  Live operator-(const Live& other) const {
    return {requested - other.requested, allocated - other.allocated};
  }
};

Live host_live() {
  const AllocatorStats stats = allocator_for(Device::cpu()).stats();
  return {static_cast<double>(stats.requested_bytes), static_cast<double>(stats.allocated_bytes)};
}

// What each piece's forward left allocated.
struct Kept {
  Live embeddings;
  std::vector<Live> blocks;
  Live head;           // ln_f, the projection, the logits and the loss's state
  Live executor_head;  // after the loss's backward, dlogits kept and the logits dropped
};

Tensor token_ids(const GPTConfig& config, int64_t rows, int64_t tokens, int64_t salt) {
  std::vector<int32_t> ids(static_cast<size_t>(rows * tokens));
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<int32_t>((i * 7 + static_cast<size_t>(salt)) %
                                  static_cast<size_t>(config.vocab));
  }
  return Tensor::from_vector(ids, {rows, tokens});
}

// Runs `model`'s pieces one after the other on one tape and reads the live
// bytes (`mark`) after each; every output stays alive until the end.
template <typename Loss>
Kept run_pieces(models::GPTPart& model, Loss& loss, const Tensor& ids, const Tensor& targets,
                const std::function<Live()>& mark) {
  {
    nn::Tape tape, loss_tape;
    loss.forward(model.forward(ids, tape), targets, loss_tape);
  }
  Kept kept;
  nn::Tape tape, loss_tape;
  tape.set_random_seed(11);
  const Live start = mark();
  Tensor x = model.embeddings()->forward(ids, tape);
  Live last = mark();
  kept.embeddings = last - start;
  for (nn::Module* block : model.blocks().children()) {
    x = block->forward(x, tape);
    const Live now = mark();
    kept.blocks.push_back(now - last);
    last = now;
  }
  Tensor logits = model.head()->forward(x, tape);
  loss.forward(logits, targets, loss_tape);
  kept.head = mark() - last;
  // As the pipeline executor runs the last chunk: the loss's backward at once.
  const Tensor dlogits = loss.backward(loss_tape);
  logits = Tensor();
  kept.executor_head = mark() - last;
  return kept;
}

// A piece's measured bytes against its figure times `ranks` (the ranks that
// share the allocator).
void check_piece(const char* piece, const Live& kept, double want, int ranks = 1) {
  INFO(piece << ": predicted " << static_cast<int64_t>(want) << " bytes per rank, measured "
             << static_cast<int64_t>(kept.requested) << " requested and "
             << static_cast<int64_t>(kept.allocated) << " allocated over " << ranks << " rank(s)");
  CHECK(want > 0);
  CHECK(kept.requested == ranks * want);
  CHECK(kept.allocated >= kept.requested);
  CHECK(kept.allocated - kept.requested < ranks * 17 * 4096);
}

// Every piece of `config`'s `layers` blocks against gpt_activation_bytes,
// with or without an open PackedWeightScope (which holds the weight copies:
// the tape keeps none either way); under tp > 1 the tp ranks shared the
// allocator.
void check_kept(const Kept& kept, const GPTConfig& config, int64_t rows, int64_t tokens, int tp = 1,
                bool sequence_parallel = false) {
  const GPTActivationBytes want =
      models::gpt_activation_bytes(config, rows, tokens, tp, sequence_parallel);
  check_piece("embeddings", kept.embeddings, want.embeddings, tp);
  CHECK(kept.blocks.size() == static_cast<size_t>(config.layers));
  for (const Live& block : kept.blocks) check_piece("block", block, want.block, tp);
  check_piece("head", kept.head, want.head, tp);
  check_piece("head as the pipeline executor keeps it", kept.executor_head,
              want.head - want.loss_state, tp);
}

// `scope`: the weight scope to open around the pieces, or none.
Kept run_single_rank(const GPTConfig& config, int64_t rows, int64_t tokens,
                     std::optional<kernels::PackedWeightScope>* scope = nullptr) {
  models::GPT model("", config);
  nn::CrossEntropyLoss loss;
  if (scope != nullptr) scope->emplace(int64_t{1} << 30);
  return run_pieces(model, loss, token_ids(config, rows, tokens, 0),
                    token_ids(config, rows, tokens, 3), host_live);
}

struct Variant {
  std::string name;
  GPTConfig config;
};

// Each precision with dropout, both checkpointings, the tanh GELU and the fused attention, one
// at a time.
std::vector<Variant> variants(const GPTConfig& base) {
  std::vector<Variant> out;
  for (const char* precision : {"fp32", "bf16", "fp16"}) {
    GPTConfig c = base;
    c.module.precision = nn::precision_from_string(precision);
    out.push_back({precision, c});
    GPTConfig dropout = c;
    dropout.dropout = 0.1f;
    out.push_back({std::string(precision) + ", dropout 0.1", dropout});
    GPTConfig blocks = c;
    blocks.checkpoint_blocks = true;
    out.push_back({std::string(precision) + ", checkpoint_blocks", blocks});
    GPTConfig attention = c;
    attention.checkpoint_attention = true;
    attention.dropout = 0.1f;
    out.push_back({std::string(precision) + ", checkpoint_attention, dropout 0.1", attention});
    GPTConfig tanh = c;
    tanh.gelu = kernels::Activation::gelu_tanh;
    out.push_back({std::string(precision) + ", tanh GELU", tanh});
    GPTConfig fused = c;
    fused.attention = nn::AttentionKernel::fused;
    fused.dropout = 0.1f;
    out.push_back({std::string(precision) + ", fused attention, dropout 0.1", fused});
  }
  return out;
}

GPTConfig small_config() {
  GPTConfig c;
  c.vocab = 61;
  c.layers = 2;
  c.d_model = 48;
  c.heads = 3;
  c.seq_len = 12;
  c.module.seed = 7;
  return c;
}

}  // namespace

TEST_CASE("GPT activation bytes: the prediction equals what each piece keeps, one rank",
          "[gpt][memory]") {
  // Odd sizes (tensors of any byte count, fewer tokens than seq_len), then
  // the GPT of the pipeline benchmark's issue 4 (d_model 256, 4 heads,
  // vocabulary 8192) on one sequence of 128 tokens.
  GPTConfig wide;
  wide.layers = 2;
  for (const auto& [base, rows, tokens] : {std::tuple{small_config(), int64_t{3}, int64_t{10}},
                                           std::tuple{wide, int64_t{1}, int64_t{128}}}) {
    for (const Variant& v : variants(base)) {
      INFO(v.name << ", d_model " << base.d_model << ", " << rows << " rows of " << tokens
                  << " tokens");
      const Kept kept = run_single_rank(v.config, rows, tokens);
      check_kept(kept, v.config, rows, tokens);
    }
  }
}

TEST_CASE("GPT activation bytes: an open weight scope holds the rounded weight copies",
          "[gpt][memory]") {
  for (const char* precision : {"fp32", "bf16"}) {
    GPTConfig config = small_config();
    config.module.precision = nn::precision_from_string(precision);
    INFO(precision);
    const GPTActivationBytes want = models::gpt_activation_bytes(config, 2, 12);
    // The copies are 12 d^2 per block and V d for the head, in bf16; none in fp32.
    const double copy = std::string(precision) == "bf16" ? 2.0 : 0.0;
    CHECK(want.block_weight_copies == 12 * 48 * 48 * copy);
    CHECK(want.head_weight_copies == 61 * 48 * copy);
    // The tapes keep none either way; the scope made one per weight, in the
    // thrown-away first forward, and served every later product from it.
    std::optional<kernels::PackedWeightScope> scope;
    check_kept(run_single_rank(config, 2, 12, &scope), config, 2, 12);
    const kernels::PackedWeightScope::Stats stats = scope->stats();
    CHECK(stats.rounded == (copy > 0 ? 4 * config.layers + 1 : 0));
    CHECK(stats.over_budget == 0);
  }
}

TEST_CASE("GPT activation bytes: tensor parallel ranks keep their predicted share",
          "[gpt][memory][tp]") {
  // 61 words: tp = 2 pads the vocabulary to 62, 31 columns per rank.
  GPTConfig base = small_config();
  base.d_model = 64;
  base.heads = 4;
  base.seq_len = 16;
  const int tp = 2;
  for (const bool sp : {false, true}) {
    for (const auto& [rows, tokens] : {std::pair<int64_t, int64_t>{2, 16}, {3, 6}}) {
      for (const Variant& v : variants(base)) {
        INFO(v.name << ", tp " << tp << (sp ? " with" : " without") << " sequence parallelism, "
                    << rows << " rows of " << tokens << " tokens");
        std::barrier step(tp);
        std::vector<Kept> kept(tp);
        comm::run_local_ranks(comm::make_local_group(tp), [&](comm::Communicator& c) {
          parallel::TensorParallelGPTLayers layers(c.shared_from_this(), {.sequence_parallel = sp});
          layers.check(v.config);
          models::GPT model("", v.config, layers);
          parallel::VocabParallelCrossEntropy loss("loss", v.config.vocab, c.shared_from_this());
          // Rank 0 reads the allocator while every rank waits.
          auto mark = [&] {
            step.arrive_and_wait();
            const Live live = c.rank() == 0 ? host_live() : Live{};
            step.arrive_and_wait();
            return live;
          };
          kept[static_cast<size_t>(c.rank())] =
              run_pieces(model, loss, token_ids(v.config, rows, tokens, 0),
                         token_ids(v.config, rows, tokens, 3), mark);
        });
        check_kept(kept[0], v.config, rows, tokens, tp, sp);
      }
    }
  }
}

TEST_CASE("GPT activation bytes: what sequence parallelism splits, and what it does not",
          "[gpt][memory]") {
  // Per rank, against tp = 1, for issue 4's GPT in fp32 on one sequence of 128.
  GPTConfig c;
  c.attention = nn::AttentionKernel::materialized;
  const GPTActivationBytes one = models::gpt_activation_bytes(c, 1, 128);
  const GPTActivationBytes tp2 = models::gpt_activation_bytes(c, 1, 128, 2);
  const GPTActivationBytes sp2 = models::gpt_activation_bytes(c, 1, 128, 2, true);
  const double n = 128, d = 256;
  // Without SP the split layers' activations halve (q | k | v, the 4 heads'
  // probabilities, c_proj's input, c_fc's pre-activation and GELU output); the
  // residual stream, the LayerNorm statistics and the split Linears' inputs do not.
  CHECK(one.block - tp2.block == 4 * (3 * n * d + 4 * n * n + n * d + 8 * n * d) / 2);
  // SP halves the residual stream and the statistics, and c_attn's and c_fc's
  // inputs, which keep only this rank's tokens (NOTE [sequence-parallel input
  // kept as a slice]): every byte a block keeps is split, Korthikanti et al.'s
  // 34 s b h / t.
  CHECK(tp2.block - sp2.block == 4 * (4 * n * d / 2 + 4 * n / 2));
  CHECK(sp2.block == one.block / 2);
  CHECK(sp2.embeddings == n / 2 * d * 4 + n * 4);
}

TEST_CASE("GPT activation bytes: bad sizes are named", "[gpt][memory]") {
  const GPTConfig c = small_config();
  CHECK_THROWS_WITH(models::gpt_activation_bytes(c, 0, 4), Contains("rows is 0"));
  CHECK_THROWS_WITH(models::gpt_activation_bytes(c, 1, 13),
                    Contains("tokens is 13; it must be in [1, seq_len 12]"));
  CHECK_THROWS_WITH(models::gpt_activation_bytes(c, 1, 12, 0), Contains("tp is 0"));
  CHECK_THROWS_WITH(models::gpt_activation_bytes(c, 1, 12, 2),
                    Contains("tensor parallel size 2 does not divide 3 attention heads"));
  GPTConfig four = c;
  four.heads = 4;
  CHECK_THROWS_WITH(models::gpt_activation_bytes(four, 1, 9, 2, true),
                    Contains("tp = 2 does not divide 9 tokens"));
}

TEST_CASE("GPT attention transient bytes: what the materialised attention's backward holds",
          "[gpt][memory]") {
  // One block's attention alone, on the host: the backward's peak above what
  // was allocated before it is the predicted transient (the score-sized
  // buffers) plus its O(B T C) buffers: the split output gradient, the q, k,
  // v gradients head-major, and the merged input gradient (7 B T C elements).
  const int64_t rows = 2, tokens = 32, heads = 2, channels = 64;
  for (const char* precision : {"fp32", "bf16"}) {
    GPTConfig config;
    config.heads = heads;
    config.d_model = channels;
    config.seq_len = tokens;
    config.module.precision = nn::precision_from_string(precision);
    config.attention = nn::AttentionKernel::materialized;
    const DType dtype = config.module.precision.reduced() ? DType::bf16 : DType::f32;
    INFO(precision);
    nn::CausalSelfAttention attention("attn", heads, nn::AttentionKernel::materialized);
    const Tensor qkv = Tensor::full({rows, tokens, 3 * channels}, 0.5).to(dtype);
    const Tensor dy = Tensor::full({rows, tokens, channels}, 0.5).to(dtype);
    Allocator& host = allocator_for(Device::cpu());
    nn::Tape tape;
    attention.forward(qkv, tape);
    const size_t before = host.stats().allocated_bytes;
    host.reset_peak_stats();
    const Tensor dqkv = attention.backward_input(dy, tape);
    const double peak = static_cast<double>(host.stats().peak_allocated_bytes - before);
    const double buffers = 7.0 * rows * tokens * channels * static_cast<double>(dtype_size(dtype));
    CHECK(peak == models::gpt_attention_transient_bytes(config, rows, tokens) + buffers);
    config.attention = nn::AttentionKernel::fused;
    CHECK(models::gpt_attention_transient_bytes(config, rows, tokens) == 0.0);
  }
}
