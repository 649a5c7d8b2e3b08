// GPT-2 interoperability: Loom's GPT as Hugging Face's GPT-2 stores it.
//
// Loom's GPT is GPT-2 (models/gpt.hpp) with its parameter names; two things
// differ on disk. GPT-2's block linear layers are Conv1D, whose weights are
// [in, out] where Loom's are [out, in]; and a GPT-2 checkpoint travels with a
// config.json giving the model's sizes, which Loom's checkpoints keep in
// TrainingState::info when the training program records them
// (gpt_model_info). `loom-ckpt consolidate --gpt2` writes both;
// checkpoint::load_weights reads either layout.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>

#include "loom/core/tensor.hpp"
#include "loom/models/gpt_config.hpp"

namespace loom::checkpoint {

// GPT-2 stores these linear weights as Conv1D [in, out], Loom as [out, in]:
// a block's attn.c_attn, attn.c_proj, mlp.c_fc and mlp.c_proj weights.
bool is_gpt2_conv1d(const std::string& name);

// `t` transposed (a host f32 copy) when is_gpt2_conv1d(name), else `t`: a
// Loom weight as GPT-2 stores it, and back.
Tensor gpt2_conv1d_transposed(const std::string& name, const Tensor& t);

// The model's sizes as keys of TrainingState::info ("model.vocab",
// "model.layers", "model.d_model", "model.heads", "model.seq_len",
// "model.gelu" (exact or tanh), "model.dropout"), for a training program to
// save with its checkpoints.
std::map<std::string, std::string> gpt_model_info(const models::GPTConfig& config);

// Hugging Face's config.json for GPT2LMHeadModel with the sizes `info`
// records (gpt_model_info's keys), or nullopt when it lacks any of them.
// Throws loom::Error naming the key when one is not a number or not a GELU.
std::optional<std::string> gpt2_config_json(const std::map<std::string, std::string>& info);
// Writes that config.json to `path` atomically (the previous file or the
// whole new one); returns false, writing nothing, when `info` lacks the sizes.
bool write_gpt2_config(const std::filesystem::path& path,
                       const std::map<std::string, std::string>& info);

// The model's sizes from Hugging Face's config.json of a GPT-2 model
// (vocab_size, n_layer, n_embd, n_head, n_positions, activation_function
// gelu_new or gelu), dropout 0. Throws loom::Error naming the file and the key
// when one is missing or not a positive whole number, or when the file
// describes a model Loom's GPT is not (n_inner other than 4 x n_embd, a
// LayerNorm epsilon other than 1e-5, untied head, GPT-2's optional attention
// variants).
models::GPTConfig read_gpt2_config(const std::filesystem::path& path);
// The same from the text of such a config (gpt2_config_json's, say);
// `where` names it in errors.
models::GPTConfig parse_gpt2_config(const std::string& text, const std::string& where);

}  // namespace loom::checkpoint
