// Context: what one micro-batch's forward pass saved for its backward pass.
//
// The caller owns one Context per micro-batch in flight (a 1F1B pipeline keeps
// up to p of them alive). forward(x, ctx) stores each module's state in ctx;
// backward consumes and releases it. A module with parameters releases its
// state in backward_weight(), a module without in backward_input(), so after a
// complete backward the context is empty again and can be reused.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
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

class Context {
 public:
  Context() = default;
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  Context(Context&&) = default;
  Context& operator=(Context&&) = default;

  // Creates `module`'s state for this micro-batch. Throws if it already has one
  // (a module called twice in one forward pass needs one Context per call).
  template <typename State>
  State& emplace(const Module& module) {
    auto [it, inserted] = states_.try_emplace(&module);
    if (!inserted) throw_duplicate(module);
    auto state = std::make_unique<State>();
    State& ref = *state;
    it->second = std::move(state);
    return ref;
  }

  // The state `module` saved in forward; throws naming the module if absent
  // (backward without forward, or backward called twice).
  template <typename State>
  State& get(const Module& module) const {
    auto it = states_.find(&module);
    if (it == states_.end()) throw_missing(module);
    auto* state = dynamic_cast<State*>(it->second.get());
    if (state == nullptr) throw_wrong_type(module, typeid(State).name());
    return *state;
  }

  // Seed for random ops in this micro-batch (Dropout): a module derives its key
  // from this and its name, so activation checkpointing's recompute, which
  // copies the seed into a fresh context, draws the same mask.
  void set_random_seed(uint64_t seed) { random_seed_ = seed; }
  uint64_t random_seed() const { return random_seed_; }

  bool has(const Module& module) const { return states_.count(&module) != 0; }
  void release(const Module& module) { states_.erase(&module); }
  void clear() { states_.clear(); }
  bool empty() const { return states_.empty(); }
  size_t size() const { return states_.size(); }

 private:
  [[noreturn]] static void throw_duplicate(const Module& module);
  [[noreturn]] static void throw_missing(const Module& module);
  [[noreturn]] static void throw_wrong_type(const Module& module, const char* type);

  std::unordered_map<const Module*, std::unique_ptr<SavedState>> states_;
  uint64_t random_seed_ = 0;
};

}  // namespace loom::nn
