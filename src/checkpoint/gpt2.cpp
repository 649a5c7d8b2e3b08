#include "loom/checkpoint/gpt2.hpp"

#include <nlohmann/json.hpp>

#include <charconv>
#include <cmath>
#include <fstream>
#include <iterator>
#include <string_view>
#include <vector>

#include "core/atomic_file.hpp"
#include "loom/core/error.hpp"

namespace loom::checkpoint {

bool is_gpt2_conv1d(const std::string& name) {
  for (const std::string_view suffix :
       {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"}) {
    if (name.size() > suffix.size() && name.ends_with(suffix)) return true;
  }
  return false;
}

Tensor gpt2_conv1d_transposed(const std::string& name, const Tensor& t) {
  if (!is_gpt2_conv1d(name)) return t;
  LOOM_CHECK(t.dim() == 2, "tensor '", name, "' is ", shape_str(t.shape()),
             ": a linear weight has two dimensions");
  const int64_t rows = t.size(0), cols = t.size(1);
  const std::vector<float> in = t.to_vector<float>();
  std::vector<float> out(in.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) out[c * rows + r] = in[r * cols + c];
  }
  return Tensor::from_vector(out, {cols, rows});
}

std::map<std::string, std::string> gpt_model_info(const models::GPTConfig& config) {
  return {{"model.vocab", std::to_string(config.vocab)},
          {"model.layers", std::to_string(config.layers)},
          {"model.d_model", std::to_string(config.d_model)},
          {"model.heads", std::to_string(config.heads)},
          {"model.seq_len", std::to_string(config.seq_len)},
          {"model.gelu", config.gelu == kernels::Activation::gelu_tanh ? "tanh" : "exact"},
          {"model.dropout", std::to_string(config.dropout)}};
}

namespace {

int64_t positive_integer(const std::map<std::string, std::string>& info, const std::string& key) {
  const std::string& text = info.at(key);
  int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  LOOM_CHECK(error == std::errc() && end == text.data() + text.size() && value > 0,
             "checkpoint info ", key, " = '", text, "' is not a positive whole number");
  return value;
}

}  // namespace

std::optional<std::string> gpt2_config_json(const std::map<std::string, std::string>& info) {
  for (const char* key : {"model.vocab", "model.layers", "model.d_model", "model.heads",
                          "model.seq_len", "model.gelu", "model.dropout"}) {
    if (info.count(key) == 0) return std::nullopt;
  }
  const std::string& gelu = info.at("model.gelu");
  LOOM_CHECK(gelu == "exact" || gelu == "tanh", "checkpoint info model.gelu = '", gelu,
             "' is not exact or tanh");
  double dropout = 0;
  try {
    dropout = std::stod(info.at("model.dropout"));
  } catch (const std::exception&) {
    throw Error(str_cat("checkpoint info model.dropout = '", info.at("model.dropout"),
                        "' is not a number"));
  }
  // The end-of-text token where the vocabulary is a known tokenizer's:
  // GPT-2's (50256 of 50257) or Loom's byte-level end of document (256 of 257).
  const int64_t vocab = positive_integer(info, "model.vocab");
  const nlohmann::json end_of_text = vocab == 50257 ? nlohmann::json(50256)
                                     : vocab == 257 ? nlohmann::json(256)
                                                    : nullptr;
  // GPT2Config's fields. Loom drops out after the embedding sum and each
  // residual branch (resid_pdrop, embd_pdrop), not inside the attention.
  nlohmann::ordered_json config = {{"architectures", {"GPT2LMHeadModel"}},
                                   {"model_type", "gpt2"},
                                   {"vocab_size", vocab},
                                   {"n_positions", positive_integer(info, "model.seq_len")},
                                   {"n_embd", positive_integer(info, "model.d_model")},
                                   {"n_layer", positive_integer(info, "model.layers")},
                                   {"n_head", positive_integer(info, "model.heads")},
                                   {"n_inner", nullptr},
                                   {"activation_function", gelu == "tanh" ? "gelu_new" : "gelu"},
                                   {"layer_norm_epsilon", 1e-5},
                                   {"resid_pdrop", dropout},
                                   {"embd_pdrop", dropout},
                                   {"attn_pdrop", 0.0},
                                   {"initializer_range", 0.02},
                                   {"tie_word_embeddings", true},
                                   {"bos_token_id", end_of_text},
                                   {"eos_token_id", end_of_text},
                                   {"torch_dtype", "float32"}};
  return config.dump(2) + "\n";
}

bool write_gpt2_config(const std::filesystem::path& path,
                       const std::map<std::string, std::string>& info) {
  const std::optional<std::string> json = gpt2_config_json(info);
  if (!json) return false;
  detail::write_file_atomically(path, "GPT-2 config", *json);
  return true;
}

models::GPTConfig read_gpt2_config(const std::filesystem::path& path) {
  const std::string where = str_cat("GPT-2 config ", path.string());
  std::ifstream in(path, std::ios::binary);
  LOOM_CHECK(in, where, ": cannot open it");
  return parse_gpt2_config(std::string(std::istreambuf_iterator<char>(in), {}), where);
}

models::GPTConfig parse_gpt2_config(const std::string& text, const std::string& where) {
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(str_cat(where, ": not JSON: ", e.what()));
  }
  LOOM_CHECK(json.is_object(), where, ": expected a JSON object, got ", json.type_name());
  const auto size = [&](const char* key) {
    LOOM_CHECK(json.contains(key), where, ": has no \"", key, "\"");
    const nlohmann::json& v = json.at(key);
    LOOM_CHECK(v.is_number_integer() && v.get<int64_t>() > 0, where, ": \"", key, "\" is ",
               v.dump(), ", not a positive whole number");
    return v.get<int64_t>();
  };
  models::GPTConfig config;
  config.vocab = size("vocab_size");
  config.layers = size("n_layer");
  config.d_model = size("n_embd");
  config.heads = size("n_head");
  config.seq_len = size("n_positions");
  config.dropout = 0;  // read for inference; a training program sets its own
  const std::string activation = json.value("activation_function", std::string("gelu_new"));
  LOOM_CHECK(activation == "gelu_new" || activation == "gelu", where, ": activation_function \"",
             activation,
             "\" is not gelu_new (GPT-2's tanh GELU) or gelu (the exact one), the "
             "two Loom's GPT has");
  config.gelu = activation == "gelu" ? kernels::Activation::gelu : kernels::Activation::gelu_tanh;
  // What Loom's GPT fixes and GPT2Config lets vary: refused unless it is
  // GPT-2's choice, so a model that is not Loom's is never read as one.
  const auto inner = json.find("n_inner");
  LOOM_CHECK(inner == json.end() || inner->is_null() ||
                 (inner->is_number_integer() && inner->get<int64_t>() == 4 * config.d_model),
             where, ": n_inner ", inner == json.end() ? "" : inner->dump(), " is not 4 x n_embd (",
             4 * config.d_model, "), the MLP width of Loom's GPT");
  const double eps = json.value("layer_norm_epsilon", 1e-5);
  LOOM_CHECK(std::abs(eps - 1e-5) <= 1e-12, where, ": layer_norm_epsilon ", eps,
             " is not 1e-5, the LayerNorm epsilon of Loom's GPT");
  for (const char* key : {"scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"}) {
    LOOM_CHECK(!json.value(key, false), where, ": ", key,
               " is true; Loom's GPT has GPT-2's attention without it");
  }
  LOOM_CHECK(json.value("scale_attn_weights", true), where,
             ": scale_attn_weights is false; Loom's GPT scales by 1/sqrt(head size)");
  LOOM_CHECK(json.value("tie_word_embeddings", true), where,
             ": tie_word_embeddings is false; Loom's GPT ties its head to wte");
  config.validate();
  return config;
}

}  // namespace loom::checkpoint
