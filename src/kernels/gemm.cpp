// gemm(): argument checks, empty problems, batch folding, dispatch by device.
#include "loom/kernels/gemm.hpp"

#include <atomic>
#include <functional>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <unordered_map>

#include "kernels/cpu/bf16_gemm.hpp"
#include "kernels/cpu/gemm.hpp"
#include "kernels/cpu/packed_gemm.hpp"
#include "kernels/gemm_problem.hpp"
#include "kernels/packed_weight_store.hpp"
#include "kernels/tensor_checks.hpp"
#include "loom/config.hpp"
#include "loom/core/allocator.hpp"
#include "loom/core/stream.hpp"
#include "loom/kernels/bias.hpp"
#include "loom/kernels/elementwise.hpp"

#if LOOM_HAS_CUDA
#include "kernels/cuda/gemm.cuh"
#endif

namespace loom::kernels {
namespace {

struct GemmShape {
  int64_t batch = 1, m = 0, n = 0, k = 0;
  bool a_shared = false, b_shared = false;  // a 2-D operand used by every batch entry
};

std::string describe(const Tensor& a, const Tensor& b, const Tensor& c, const GemmOptions& o) {
  return str_cat("A ", a, ", B ", b, ", C ", c, ", trans_a=", o.trans_a, ", trans_b=", o.trans_b);
}

Shape leading(const Tensor& t) {
  return Shape(t.shape().begin(), t.shape().end() - 2);
}

GemmShape check_gemm(const Tensor& a, const Tensor& b, const Tensor& c, const GemmOptions& o) {
  LOOM_CHECK(a.defined() && b.defined() && c.defined(),
             "gemm: A, B and C must all be defined; got ", describe(a, b, c, o));
  LOOM_CHECK(is_floating(a.dtype()), "gemm: dtype ", a.dtype(),
             " is not a floating-point type (f32, bf16, f16); got ", describe(a, b, c, o));
  // Mixed precision: bf16 or f16 operands, an f32 result.
  const bool mixed = c.dtype() == DType::f32 && a.dtype() != DType::f32;
  LOOM_CHECK(a.dtype() == b.dtype() && (c.dtype() == a.dtype() || mixed), "gemm: A and B must ",
             "have one dtype, and C that dtype or f32 (for bf16 or f16 A and B); got ",
             describe(a, b, c, o));
  LOOM_CHECK(a.device() == c.device() && b.device() == c.device(),
             "gemm: A, B and C must be on one device; got ", describe(a, b, c, o));
  LOOM_CHECK(a.dim() >= 2 && b.dim() >= 2 && c.dim() >= 2,
             "gemm: A, B and C must have at least 2 dimensions; got ", describe(a, b, c, o));

  GemmShape s;
  const Shape batch_dims = leading(c);
  s.batch = shape_numel(batch_dims);
  s.a_shared = a.dim() == 2;
  s.b_shared = b.dim() == 2;
  LOOM_CHECK(s.a_shared || leading(a) == batch_dims, "gemm: A ", shape_str(a.shape()),
             " must be 2-D (shared by the batch) or have C's batch dimensions ",
             shape_str(batch_dims), "; got ", describe(a, b, c, o));
  LOOM_CHECK(s.b_shared || leading(b) == batch_dims, "gemm: B ", shape_str(b.shape()),
             " must be 2-D (shared by the batch) or have C's batch dimensions ",
             shape_str(batch_dims), "; got ", describe(a, b, c, o));

  const int64_t a_rows = a.size(-2), a_cols = a.size(-1);
  const int64_t b_rows = b.size(-2), b_cols = b.size(-1);
  const int64_t m = o.trans_a ? a_cols : a_rows, k_a = o.trans_a ? a_rows : a_cols;
  const int64_t k_b = o.trans_b ? b_cols : b_rows, n = o.trans_b ? b_rows : b_cols;
  LOOM_CHECK(k_a == k_b, "gemm: inner dimensions differ: op(A) is [", m, ", ", k_a,
             "] and op(B) is [", k_b, ", ", n, "]; op(A) [m, k] @ op(B) [k, n] needs one k (",
             describe(a, b, c, o), ")");
  LOOM_CHECK(c.size(-2) == m && c.size(-1) == n, "gemm: C's matrices are [", c.size(-2), ", ",
             c.size(-1), "] but op(A) @ op(B) is [", m, ", ", n, "] (", describe(a, b, c, o), ")");
  LOOM_CHECK(!detail::overlaps(c, a) && !detail::overlaps(c, b),
             "gemm: C must not overlap A or B; got ", describe(a, b, c, o));
  s.m = m;
  s.n = n;
  s.k = k_a;
  return s;
}

}  // namespace

// NOTE [packed weight reuse] in loom/kernels/gemm.hpp.
struct PackedWeightScope::Cache final : cpu::WeightPacks {
  struct Key {
    const void* data = nullptr;
    DType dtype = DType::f32;
    bool trans = false;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& key) const {
      return std::hash<const void*>()(key.data) ^ (static_cast<size_t>(key.dtype) << 1) ^
             static_cast<size_t>(key.trans);
    }
  };
  struct Entry {
    Tensor b;  // held, so that its memory holds these values until the scope ends
    std::unique_ptr<cpu::PackedGemmB> f32;  // or
    std::unique_ptr<cpu::Bf16PackedB> bf16;
    bool matches(const detail::GemmProblem& p) const {
      return f32 ? f32->matches(p) : bf16->matches(p);
    }
  };

  // Runs `p` (B is `b`) on a packed copy kept by the innermost open scope;
  // false when there is none or the problem is not one it serves: host f32 on
  // the packed kernel, or bf16 on the dot-product kernel, B shared by the batch.
  static bool run(const detail::GemmProblem& p, const Tensor& b) {
    Cache* cache = innermost();
    if (cache == nullptr || (p.stride_b != 0 && p.batch != 1)) return false;
    const bool f32 =
        p.dtype == DType::f32 && p.c_dtype == DType::f32 && cpu::packed_gemm_available();
    const bool bf16 =
        p.dtype == DType::bf16 && cpu::bf16_gemm_kernel() == cpu::Bf16GemmKernel::dot_product;
    if (!f32 && !bf16) return false;
    const Key key{b.data(), p.dtype, p.trans_b};
    auto found = cache->entries.find(key);
    if (found == cache->entries.end()) {
      const int64_t bytes = f32 ? cpu::PackedGemmB::bytes_for(p) : cpu::Bf16PackedB::bytes_for(p);
      if (!cache->reserve_packing(bytes)) return false;
      Entry entry{.b = b, .f32 = nullptr, .bf16 = nullptr};
      if (f32) {
        entry.f32 = std::make_unique<cpu::PackedGemmB>(p);
      } else {
        entry.bf16 = std::make_unique<cpu::Bf16PackedB>(p);
      }
      ++cache->stats.packed;
      found = cache->entries.emplace(key, std::move(entry)).first;
    } else if (!found->second.matches(p)) {
      return false;  // the same data viewed as another shape: not worth a second copy
    } else {
      ++cache->stats.hits;
    }
    if (f32) {
      cpu::packed_gemm(p, *found->second.f32);
    } else {
      cpu::bf16_dot_gemm(p, *found->second.bf16);
    }
    return true;
  }

  // Counts `bytes` against max_bytes; false (counted as over budget) when they do not fit.
  bool reserve(int64_t bytes) {
    if (stats.bytes + bytes > max_bytes) {
      ++stats.over_budget;
      return false;
    }
    stats.bytes += bytes;
    return true;
  }

  // reserve() for a packing: packings are raw aligned buffers, not the
  // allocator's, so they are declared to it while the scope keeps them (NOTE
  // [memory outside the allocator]).
  bool reserve_packing(int64_t bytes) {
    if (!reserve(bytes)) return false;
    allocator_for(Device::cpu()).add_external(bytes);
    external_bytes += bytes;
    return true;
  }
  ~Cache() override {
    if (external_bytes > 0) allocator_for(Device::cpu()).add_external(-external_bytes);
  }

  static Cache*& innermost() {
    thread_local Cache* cache = nullptr;
    return cache;
  }

  // cpu::WeightPacks: a convolution's packed weight, by its data and the tag.
  const float* get(const void* weight, int tag, int64_t floats,
                   const std::function<void(float*)>& fill) override {
    const PackKey key{weight, tag, floats};
    auto found = packs.find(key);
    if (found != packs.end()) {
      ++stats.hits;
      return found->second.get();
    }
    if (!reserve_packing(floats * static_cast<int64_t>(sizeof(float)))) return nullptr;
    std::unique_ptr<float[], AlignedDelete> pack(static_cast<float*>(
        ::operator new[](static_cast<size_t>(floats) * sizeof(float), std::align_val_t{64})));
    fill(pack.get());
    ++stats.packed;
    return packs.emplace(key, std::move(pack)).first->second.get();
  }

  struct AlignedDelete {
    void operator()(float* p) const { ::operator delete[](p, std::align_val_t{64}); }
  };
  struct PackKey {
    const void* weight = nullptr;
    int tag = 0;
    int64_t floats = 0;
    bool operator==(const PackKey&) const = default;
  };
  struct PackKeyHash {
    size_t operator()(const PackKey& key) const {
      return std::hash<const void*>()(key.weight) ^ (static_cast<size_t>(key.tag) << 1) ^
             (static_cast<size_t>(key.floats) << 8);
    }
  };

  int64_t max_bytes = 0;
  Stats stats;
  std::unordered_map<Key, Entry, KeyHash> entries;
  // Convolution weights' packings (get()) and the weights they hold.
  std::unordered_map<PackKey, std::unique_ptr<float[], AlignedDelete>, PackKeyHash> packs;
  std::unordered_map<const void*, Tensor> held;
  // Rounded copies (rounded()), by the weight's data and the dtype.
  std::unordered_map<Key, std::pair<Tensor, Tensor>, KeyHash> copies;
  Cache* enclosing = nullptr;
  int64_t external_bytes = 0;  // of stats.bytes, the packings (rounded copies are tensors)
};

std::optional<Tensor> PackedWeightScope::rounded(const Tensor& weight, DType dtype) {
  Cache* cache = Cache::innermost();
  if (cache == nullptr) return std::nullopt;
  const Cache::Key key{weight.data(), dtype, false};
  auto found = cache->copies.find(key);
  if (found != cache->copies.end() && found->second.first.shape() == weight.shape() &&
      found->second.first.dtype() == weight.dtype()) {
    ++cache->stats.hits;
    return found->second.second;
  }
  if (found != cache->copies.end()) return std::nullopt;  // another view of the same data
  const int64_t bytes = weight.numel() * static_cast<int64_t>(dtype_size(dtype));
  if (!cache->reserve(bytes)) return std::nullopt;
  ++cache->stats.rounded;
  Tensor copy = weight.to(dtype);
  cache->copies.emplace(key, std::make_pair(weight, copy));
  return copy;
}

namespace detail {

cpu::WeightPacks* weight_packs_holding(const Tensor& weight) {
  PackedWeightScope::Cache* cache = PackedWeightScope::Cache::innermost();
  if (cache == nullptr) return nullptr;
  cache->held.emplace(weight.data(), weight);
  return cache;
}

}  // namespace detail

PackedWeightScope::PackedWeightScope(int64_t max_bytes) : cache_(std::make_unique<Cache>()) {
  LOOM_CHECK(max_bytes >= 0, "PackedWeightScope: max_bytes ", max_bytes, " must be >= 0");
  cache_->max_bytes = max_bytes;
  cache_->enclosing = Cache::innermost();
  Cache::innermost() = cache_.get();
}

PackedWeightScope::~PackedWeightScope() {
  Cache::innermost() = cache_->enclosing;  // scopes live on the stack: the innermost ends first
}

PackedWeightScope::Stats PackedWeightScope::stats() const {
  return cache_->stats;
}

namespace {

std::atomic<int64_t> fused_epilogues{0}, separate_epilogues{0};

bool has_activation(const GemmOptions& o) {
  return o.activation.has_value() || o.activation_grad.has_value();
}

// GemmOptions::bias and bias_grad: f32, shaped [n] and [m], on C's device; a
// 2-D product with an f32 C (a bias also with a 16-bit C under an activation);
// bias_grad needs trans_a. The activation epilogues: NOTE [gemm activation
// epilogues].
void check_epilogues(const Tensor& a, const Tensor& b, const Tensor& c, const GemmOptions& o,
                     const GemmShape& s) {
  const bool activation = has_activation(o);
  if (!o.bias.defined() && !o.bias_grad.defined() && !activation && !o.pre_activation.defined() &&
      !o.pre_activation_bias_grad.defined()) {
    return;
  }
  LOOM_CHECK(!o.pre_activation_bias_grad.defined() || o.activation_grad.has_value(),
             "gemm: pre_activation_bias_grad is an epilogue of activation_grad (",
             describe(a, b, c, o), ")");
  LOOM_CHECK(activation || !o.pre_activation.defined(), "gemm: pre_activation ", o.pre_activation,
             " is given without an activation or activation_grad epilogue (", describe(a, b, c, o),
             ")");
  LOOM_CHECK(
      a.dim() == 2 && b.dim() == 2 && c.dim() == 2 && (c.dtype() == DType::f32 || activation),
      "gemm: a bias or bias_grad epilogue needs a 2-D product with an f32 C, an activation ",
      "epilogue a 2-D product; got ", describe(a, b, c, o));
  LOOM_CHECK(!o.bias.defined() || !o.bias_grad.defined(),
             "gemm: bias (a forward's) and bias_grad (a weight gradient's) are epilogues of "
             "different products; give one of them (",
             describe(a, b, c, o), ")");
  if (o.bias.defined()) {
    LOOM_CHECK(o.bias.dtype() == DType::f32 && o.bias.shape() == Shape{s.n} &&
                   o.bias.device() == c.device() && !detail::overlaps(o.bias, c),
               "gemm: bias ", o.bias, " must be f32 [", s.n, "] on ", c.device(),
               ", apart from C (", describe(a, b, c, o), ")");
  }
  if (o.bias_grad.defined()) {
    LOOM_CHECK(o.trans_a, "gemm: bias_grad sums A's columns, the output gradient of a weight ",
               "gradient op(A) = A^T: it needs trans_a (", describe(a, b, c, o), ")");
    LOOM_CHECK(o.bias_grad.dtype() == DType::f32 && o.bias_grad.shape() == Shape{s.m} &&
                   o.bias_grad.device() == c.device() && !detail::overlaps(o.bias_grad, c) &&
                   !detail::overlaps(o.bias_grad, a),
               "gemm: bias_grad ", o.bias_grad, " must be f32 [", s.m, "] on ", c.device(),
               ", apart from A and C (", describe(a, b, c, o), ")");
  }
  if (!activation) return;
  LOOM_CHECK(!(o.activation && o.activation_grad) && !(o.activation_grad && o.bias.defined()) &&
                 !o.bias_grad.defined(),
             "gemm: activation (with bias: a forward's), activation_grad (an input gradient's) and "
             "bias_grad (a weight gradient's) are epilogues of different products (",
             describe(a, b, c, o), ")");
  LOOM_CHECK(o.beta == 0.0f, "gemm: an activation epilogue needs beta 0; got beta ", o.beta, " (",
             describe(a, b, c, o), ")");
  const Tensor& pre = o.pre_activation;
  LOOM_CHECK(pre.defined() && pre.shape() == c.shape() && pre.dtype() == c.dtype() &&
                 pre.device() == c.device() && !detail::overlaps(pre, a) &&
                 !detail::overlaps(pre, b) && !detail::overlaps(pre, c),
             "gemm: pre_activation ", pre, " must be C's shape, dtype and device, apart from A, B ",
             "and C (", describe(a, b, c, o), ")");
  if (o.pre_activation_bias_grad.defined()) {
    const Tensor& db = o.pre_activation_bias_grad;
    LOOM_CHECK(db.dtype() == DType::f32 && db.shape() == Shape{s.n} && db.device() == c.device() &&
                   !detail::overlaps(db, c) && !detail::overlaps(db, pre),
               "gemm: pre_activation_bias_grad ", db, " must be f32 [", s.n, "] on ", c.device(),
               ", apart from C and pre_activation (", describe(a, b, c, o), ")");
  }
}

// The epilogues as passes after the product (NOTE [gemm epilogues]).
void separate_epilogues_pass(const Tensor& a, const Tensor& c, const GemmOptions& o) {
  if (o.bias.defined()) {
    bias_add(c, o.bias);
    ++separate_epilogues;
  }
  if (o.bias_grad.defined()) {
    bias_grad(a, o.bias_grad, o.bias_grad_accumulate);
    ++separate_epilogues;
  }
}

detail::GemmProblem problem_of(const Tensor& a, const Tensor& b, const Tensor& c,
                               const GemmOptions& options, const GemmShape& s) {
  detail::GemmProblem p;
  p.dtype = a.dtype();
  p.c_dtype = c.dtype();
  p.batch = s.batch;
  p.m = s.m;
  p.n = s.n;
  p.k = s.k;
  p.a = a.data();
  p.b = b.data();
  p.c = c.data();
  p.stride_a = s.a_shared ? 0 : s.m * s.k;
  p.stride_b = s.b_shared ? 0 : s.k * s.n;
  p.stride_c = s.m * s.n;
  p.trans_a = options.trans_a;
  p.trans_b = options.trans_b;
  p.alpha = options.alpha;
  p.beta = options.beta;
  p.allow_tf32 = options.allow_tf32;
  // A shared B (a Linear weight) times a batch of row-major, untransposed A
  // matrices is one GEMM with batch * m rows: the A and C matrices are adjacent.
  if (p.batch > 1 && s.b_shared && !s.a_shared && !p.trans_a) {
    p.m *= p.batch;
    p.batch = 1;
  }
  return p;
}

// The activation epilogues as passes around a plain product (NOTE [gemm
// activation epilogues]): the bits of a Linear then an activation module.
void activation_passes(const Tensor& a, const Tensor& b, const Tensor& c, const GemmOptions& o) {
  GemmOptions product = o;
  product.activation.reset();
  product.activation_grad.reset();
  product.pre_activation = Tensor();
  product.pre_activation_bias_grad = Tensor();
  if (o.activation) {
    // The sum in f32: in pre_activation itself when that is f32, else rounded into it once.
    const bool f32 = o.pre_activation.dtype() == DType::f32;
    const Tensor sum = f32 ? o.pre_activation : Tensor::empty(c.shape(), DType::f32, c.device());
    gemm(a, b, sum, product);
    if (!f32) o.pre_activation.copy_from(sum);
    activation_forward(*o.activation, o.pre_activation, c);
    ++separate_epilogues;
    return;
  }
  gemm(a, b, c, product);
  activation_backward(*o.activation_grad, o.pre_activation, c, c);
  ++separate_epilogues;
  if (o.pre_activation_bias_grad.defined()) {
    bias_grad(c, o.pre_activation_bias_grad, false);
    ++separate_epilogues;
  }
}

// The activation epilogues in one cuBLASLt matmul, where they are the tanh
// GELU's on CUDA and cuBLASLt offers them (a derivative's column sums, if not
// offered with it, then take a pass of their own); false, having run nothing,
// elsewhere.
bool gemm_with_activation_epilogue(const Tensor& a, const Tensor& b, const Tensor& c,
                                   const GemmOptions& o, const GemmShape& s) {
  const Activation f = o.activation ? *o.activation : *o.activation_grad;
  if (c.device().is_cpu() || f != Activation::gelu_tanh || s.m == 0 || s.n == 0 || s.k == 0) {
    return false;
  }
#if LOOM_HAS_CUDA
  DeviceGuard guard(c.device());
  const Stream stream = current_stream(c.device());
  detail::GemmProblem p = problem_of(a, b, c, o, s);
  p.bias = o.bias.defined() ? o.bias.data() : nullptr;
  p.gelu_tanh = o.activation.has_value();
  p.gelu_tanh_grad = o.activation_grad.has_value();
  p.pre_activation = o.pre_activation.data();
  p.pre_activation_bias_grad =
      o.pre_activation_bias_grad.defined() ? o.pre_activation_bias_grad.data<float>() : nullptr;
  if (cuda::gemm_with_epilogue(p, stream)) {
    fused_epilogues += 1 + (p.bias != nullptr) + (p.pre_activation_bias_grad != nullptr);
    return true;
  }
  if (p.gelu_tanh && p.bias != nullptr && c.dtype() != DType::f32) {
    // cuBLASLt documents a bias of D's dtype beside a 16-bit D: the f32 bias
    // rounded to it (as PyTorch's autocast rounds it), 2^-9 of |bias| apart.
    // The copy may be freed once queued: the allocator orders its reuse on
    // the stream.
    const Tensor rounded = o.bias.to(c.dtype());
    p.bias = rounded.data();
    p.bias_dtype = c.dtype();
    if (cuda::gemm_with_epilogue(p, stream)) {
      fused_epilogues += 2;
      return true;
    }
    return false;
  }
  if (p.pre_activation_bias_grad == nullptr) return false;
  p.pre_activation_bias_grad = nullptr;  // the derivative alone, then the sums
  if (!cuda::gemm_with_epilogue(p, stream)) return false;
  ++fused_epilogues;
  bias_grad(c, o.pre_activation_bias_grad, false);
  ++separate_epilogues;
  return true;
#else
  (void)a;
  (void)b;
  throw InternalError("unreachable: CUDA tensor in a build without CUDA");
#endif
}

}  // namespace

GemmEpilogueCounts gemm_epilogue_counts() {
  return {fused_epilogues.load(), separate_epilogues.load()};
}

void gemm(const Tensor& a, const Tensor& b, const Tensor& c, const GemmOptions& options) {
  const GemmShape s = check_gemm(a, b, c, options);
  check_epilogues(a, b, c, options, s);
  const Device device = c.device();
  if (s.batch == 0) return;
  if (has_activation(options)) {
    if (!gemm_with_activation_epilogue(a, b, c, options, s)) activation_passes(a, b, c, options);
    return;
  }
  if (s.k == 0 || s.m == 0 || s.n == 0) {  // op(A) @ op(B) is all zeros, or C is empty
    if (c.numel() > 0 && options.beta == 0.0f) {
      c.zero();
    } else if (c.numel() > 0 && options.beta != 1.0f) {
      scale(c, options.beta, c);
    }
    separate_epilogues_pass(a, c, options);
    return;
  }

  detail::GemmProblem p = problem_of(a, b, c, options, s);
  if (device.is_cpu()) {
    if (!(options.b_fixed_in_scope && PackedWeightScope::Cache::run(p, b))) cpu::gemm(p);
    separate_epilogues_pass(a, c, options);
    return;
  }
#if LOOM_HAS_CUDA
  DeviceGuard guard(device);
  const Stream stream = current_stream(device);
  if (options.bias.defined() || options.bias_grad.defined()) {
    p.bias = options.bias.defined() ? options.bias.data() : nullptr;
    p.bias_grad = options.bias_grad.defined() ? options.bias_grad.data<float>() : nullptr;
    p.bias_grad_accumulate = options.bias_grad_accumulate;
    if (cuda::gemm_with_epilogue(p, stream)) {
      fused_epilogues += (p.bias != nullptr) + (p.bias_grad != nullptr);
      return;
    }
  }
  cuda::gemm(p, stream);
  separate_epilogues_pass(a, c, options);
#else
  throw InternalError("unreachable: CUDA tensor in a build without CUDA");
#endif
}

OpCost gemm_cost(const Tensor& a, const Tensor& b, const Tensor& c, const GemmOptions& options) {
  const GemmShape s = check_gemm(a, b, c, options);
  const double products =
      static_cast<double>(s.batch) * static_cast<double>(s.m) * static_cast<double>(s.n);
  const bool reads_c = options.beta != 0.0f;
  OpCost cost;
  cost.flops = 2.0 * products * static_cast<double>(s.k) + (reads_c ? 2.0 * products : 0.0);
  cost.bytes = static_cast<double>(a.nbytes()) + static_cast<double>(b.nbytes()) +
               static_cast<double>(c.nbytes()) * (reads_c ? 2.0 : 1.0);
  return cost;
}

}  // namespace loom::kernels
