// Tape: what one micro-batch's forward pass saved for its backward pass.
//
// The caller owns one Tape per micro-batch in flight (a 1F1B pipeline keeps
// up to p of them alive). forward(x, tape) stores each module's state in tape;
// backward consumes and releases it. A module with parameters releases its
// state in backward_weight(), a module without in backward_input(), so after a
// complete backward the tape is empty again and can be reused.
//
// Every tape has a micro-batch id, unique in the process, that gradient
// writes carry to their parameter (NOTE [gradient contributions] in
// nn/parameter.hpp): uses are counted per micro-batch, so two micro-batches
// whose writes to a tied weight interleave do not make each other's gradient
// look complete. Tapes that hold parts of one micro-batch share its id: a
// schedule running several model parts on one rank gives each part's tape
// the id of the micro-batch's first (set_micro_batch), and activation
// checkpointing's recompute tape takes the id of the tape it works for.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <typeinfo>
#include <unordered_map>

#include "loom/core/error.hpp"
#include "loom/core/tensor.hpp"

namespace loom::nn {

class Module;

// Base of every module's saved state.
struct SavedState {
  virtual ~SavedState() = default;
};

class Tape {
 public:
  Tape();
  Tape(const Tape&) = delete;
  Tape& operator=(const Tape&) = delete;
  Tape(Tape&&) = default;
  Tape& operator=(Tape&&) = default;

  // Creates `owner`'s state for this micro-batch. Throws naming it if it
  // already has one (a module called twice in one forward pass needs one
  // Tape per call). The owner is usually a module; anything with a stable
  // address may own state (CrossEntropyLoss, which takes two inputs, is not a
  // Module). `name` only goes into error messages.
  template <typename State>
  State& emplace(const void* owner, std::string_view name) {
    auto [it, inserted] = states_.try_emplace(owner);
    if (!inserted) throw_duplicate(name);
    auto state = std::make_unique<State>();
    State& ref = *state;
    it->second = std::move(state);
    return ref;
  }
  template <typename State>
  State& emplace(const Module& module) {
    return emplace<State>(&module, module_name(module));
  }

  // The state `owner` saved in forward; throws naming it if absent (backward
  // without forward, or backward called twice).
  template <typename State>
  State& get(const void* owner, std::string_view name) const {
    auto it = states_.find(owner);
    if (it == states_.end()) throw_missing(name);
    auto* state = dynamic_cast<State*>(it->second.get());
    if (state == nullptr) throw_wrong_type(name, typeid(State).name());
    return *state;
  }
  template <typename State>
  State& get(const Module& module) const {
    return get<State>(&module, module_name(module));
  }

  // Whether `module` saved a State (false when it saved nothing or another
  // kind): for a module whose forward chooses among kinds of state.
  template <typename State>
  bool holds(const Module& module) const {
    auto it = states_.find(&module);
    return it != states_.end() && dynamic_cast<const State*>(it->second.get()) != nullptr;
  }

  // Seed for random ops in this micro-batch (Dropout): a module derives its key
  // from this and its name, so activation checkpointing's recompute, which
  // copies the seed into a fresh tape, draws the same mask.
  void set_random_seed(uint64_t seed) { random_seed_ = seed; }
  uint64_t random_seed() const { return random_seed_; }
  // Where this micro-batch's first row (sequence, image) sits in the step's
  // global batch: this data-parallel rank's first row plus the micro-batch's
  // within the rank's. Dropout draws row r's mask as row first_row + r of the
  // global batch under one seed for the step (NOTE [dropout by global
  // position] in nn/dropout.hpp), so any split of the batch over ranks and
  // micro-batches drops what one rank drops on the whole batch.
  void set_first_row(int64_t row) { first_row_ = row; }
  int64_t first_row() const { return first_row_; }

  // A stand-in pass: this rank has no batch of its own this step and runs a
  // stand-in (its last one) only so that its collectives match the ranks that
  // do (parallel::UnevenInputs). Its loss gradient is zero, so every gradient
  // it writes is zero; modules that keep state or pool statistics across
  // ranks must leave nothing of the stand-in behind: BatchNorm2d keeps its
  // running statistics and contributes no elements to a synchronized batch's
  // statistics. Activation checkpointing's recompute tape inherits it.
  void set_stand_in(bool stand_in) { stand_in_ = stand_in; }
  bool stand_in() const { return stand_in_; }

  // See the file comment. Ids start at 1; 0 means "no micro-batch" (a
  // gradient written outside any tape).
  uint64_t micro_batch() const { return micro_batch_; }
  void set_micro_batch(uint64_t id) { micro_batch_ = id; }

  bool has(const void* owner) const { return states_.count(owner) != 0; }
  bool has(const Module& module) const { return has(&module); }
  void release(const void* owner) { states_.erase(owner); }
  void release(const Module& module) { release(&module); }
  void clear() { states_.clear(); }
  bool empty() const { return states_.empty(); }
  size_t size() const { return states_.size(); }

 private:
  static const std::string& module_name(const Module& module);
  [[noreturn]] static void throw_duplicate(std::string_view name);
  [[noreturn]] static void throw_missing(std::string_view name);
  [[noreturn]] static void throw_wrong_type(std::string_view name, const char* type);

  std::unordered_map<const void*, std::unique_ptr<SavedState>> states_;
  uint64_t random_seed_ = 0;
  int64_t first_row_ = 0;
  uint64_t micro_batch_ = 0;
  bool stand_in_ = false;
};

}  // namespace loom::nn
