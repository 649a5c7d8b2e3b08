#include "parallel/control.hpp"

#include <bit>
#include <limits>
#include <sstream>

#include "loom/core/error.hpp"
#include "loom/nn/parameter.hpp"

namespace loom::parallel::detail {

std::vector<double> all_gather_values(comm::Communicator& comm, double value, Device device) {
  if (comm.size() == 1) return {value};
  const Tensor mine =
      Tensor::from_vector(std::vector<int64_t>{std::bit_cast<int64_t>(value)}, {1}, device);
  const Tensor all = Tensor::empty({comm.size()}, DType::i64, device);
  comm.all_gather(mine, all).wait();
  std::vector<double> values;
  for (const int64_t bits : all.to_vector<int64_t>()) values.push_back(std::bit_cast<double>(bits));
  return values;
}

int64_t all_reduce_min(comm::Communicator& comm, int64_t value, Device device) {
  Tensor t = Tensor::from_vector(std::vector<int64_t>{value}, {1}, device);
  comm.all_reduce(t, {.op = comm::ReduceOp::min}).wait();
  return t.item<int64_t>();
}

std::string broadcast_string(comm::Communicator& comm, const std::string& text, int root,
                             Device device) {
  Tensor length =
      Tensor::from_vector(std::vector<int64_t>{static_cast<int64_t>(text.size())}, {1}, device);
  comm.broadcast(length, {.root = root}).wait();
  const int64_t n = length.item<int64_t>();
  // One i32 per character: no byte dtype, and these strings are short.
  std::vector<int32_t> chars(static_cast<size_t>(n), 0);
  if (comm.rank() == root) {
    for (size_t i = 0; i < text.size(); ++i) chars[i] = static_cast<unsigned char>(text[i]);
  }
  Tensor payload = Tensor::from_vector(chars, {n}, device);
  comm.broadcast(payload, {.root = root}).wait();
  std::string out;
  out.reserve(static_cast<size_t>(n));
  for (const int32_t c : payload.to_vector<int32_t>()) out.push_back(static_cast<char>(c));
  return out;
}

std::vector<int64_t> broadcast_indices(comm::Communicator& comm, std::vector<int64_t> values,
                                       int root, Device device) {
  const auto n = static_cast<int64_t>(values.size());
  Tensor t = Tensor::from_vector(values, {n}, device);
  comm.broadcast(t, {.root = root}).wait();
  return t.to_vector<int64_t>();
}

std::string describe_parameter(const nn::Parameter& param) {
  std::ostringstream out;
  out << "'" << param.name() << "' " << param.value().dtype() << shape_str(param.shape());
  return out.str();
}

namespace {

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

}  // namespace

void check_parameter_agreement(comm::Communicator& comm, const std::vector<nn::Parameter*>& params,
                               Device device) {
  std::vector<std::string> mine;
  std::string joined;
  for (const nn::Parameter* p : params) {
    mine.push_back(describe_parameter(*p));
    joined += mine.back() + "\n";
  }
  // Rank 0 sends its list; each rank finds its first difference; the ranks
  // then agree on the smallest (index, rank) so that all of them throw the
  // same message and none is left waiting in a later collective.
  const std::vector<std::string> reference = split_lines(broadcast_string(comm, joined, 0, device));
  constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
  int64_t first = kNone;
  const size_t common = std::min(reference.size(), mine.size());
  for (size_t i = 0; i < common && first == kNone; ++i) {
    if (reference[i] != mine[i]) first = static_cast<int64_t>(i);
  }
  if (first == kNone && reference.size() != mine.size()) first = static_cast<int64_t>(common);
  const int64_t size = comm.size();
  const int64_t key = first == kNone ? kNone : first * size + comm.rank();
  const int64_t agreed = all_reduce_min(comm, key, device);
  if (agreed == kNone) return;

  const int64_t index = agreed / size;
  const int culprit = static_cast<int>(agreed % size);
  auto entry = [&](const std::vector<std::string>& list) {
    return index < static_cast<int64_t>(list.size())
               ? list[static_cast<size_t>(index)]
               : "no parameter #" + std::to_string(index) + " (" + std::to_string(list.size()) +
                     " parameters in all)";
  };
  const std::string theirs = broadcast_string(comm, entry(mine), culprit, device);
  throw Error(
      str_cat("data-parallel ranks disagree on the model's parameters at parameter #", index, ": ",
              comm.describe_rank(0), " has ", entry(reference), ", ", comm.describe_rank(culprit),
              " has ", theirs,
              " (every rank must build the same model, registering the same parameters in the "
              "same order)"));
}

}  // namespace loom::parallel::detail
