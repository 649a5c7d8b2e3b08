// CUDA dense-layer kernels against their host twins: bias (f32 exact
// add, sums to 1e-5; bf16 to its rounding), activations (1e-6 relative),
// layer norm (1e-5), embedding (gather exact, scatter-add to 1e-6 and
// deterministic across runs), index_select (rows of f32, i32, i64 and bf16
// bit for bit, its backward equal to the host's), cross-entropy (1e-5; f32
// and bf16 logits),
// dropout (bit for bit, the same mask on both backends). Over 8192 rows (the
// split reductions' several slabs): bias sums bit for bit on values whose
// sums are exact, layer norm's weight gradient within the host's f32 rounding
// and the same bits on a second run.
#include <catch2/catch.hpp>

#include <algorithm>

#include <cmath>
#include <vector>

#include "../kernels/kernel_test_util.hpp"
#include "loom/kernels/activation.hpp"
#include "loom/kernels/bias.hpp"
#include "loom/kernels/cross_entropy.hpp"
#include "loom/kernels/dropout.hpp"
#include "loom/kernels/embedding.hpp"
#include "loom/kernels/index_select.hpp"
#include "loom/kernels/layer_norm.hpp"
#include "support/compare.hpp"

using loom::Device;
using loom::DType;
using loom::RandomKey;
using loom::Tensor;
using loom::kernels::Activation;
namespace k = loom::kernels;

namespace {

const Device kGpu = Device::cuda(0);

// |device - host| <= atol + rtol * |host| per element.
void require_close(const Tensor& device, const Tensor& host, double rtol, double atol) {
  REQUIRE(loom::test::out_of_tolerance(device.to_vector<float>(), host.to_vector<float>(), atol,
                                       rtol) == "");
}

}  // namespace

TEST_CASE("CUDA bias_add and bias_grad match the host", "[cuda][bias]") {
  for (const int64_t rows : {1, 37, 1000}) {
    const int64_t cols = 77;
    const Tensor y = loom::test::random_tensor({rows, cols}, DType::f32, 1);
    const Tensor b = loom::test::random_tensor({cols}, DType::f32, 2);
    const Tensor dy_gpu = y.to(kGpu);
    k::bias_add(dy_gpu, b.to(kGpu));
    const Tensor host = y.clone();
    k::bias_add(host, b);
    require_close(dy_gpu, host, 0, 0);

    const Tensor db = Tensor::empty({cols}), db_gpu = Tensor::empty({cols}, DType::f32, kGpu);
    k::bias_grad(y, db, false);
    k::bias_grad(y.to(kGpu), db_gpu, false);
    require_close(db_gpu, db, 1e-5, 1e-5);
    k::bias_grad(y, db, true);
    k::bias_grad(y.to(kGpu), db_gpu, true);
    require_close(db_gpu, db, 1e-5, 1e-5);

    // bf16 on the device against the host on the same rounded values.
    const Tensor y16 = y.to(DType::bf16);
    const Tensor db16 = Tensor::empty({cols}, DType::bf16, kGpu);
    k::bias_grad(y16.to(kGpu), db16, false);
    const Tensor ref = Tensor::empty({cols});
    k::bias_grad(y16.to(DType::f32), ref, false);
    require_close(db16.to(DType::f32), ref, 1.0 / 128, 1e-3);
  }
}

TEST_CASE("CUDA activations match the host", "[cuda][activation]") {
  for (const Activation f : {Activation::relu, Activation::gelu, Activation::gelu_tanh}) {
    const int64_t n = 100001;
    const Tensor x = loom::test::random_tensor({n}, DType::f32, 3, -6.0f, 6.0f);
    const Tensor dy = loom::test::random_tensor({n}, DType::f32, 4);
    const Tensor y = Tensor::empty({n}), dx = Tensor::empty({n});
    k::activation_forward(f, x, y);
    k::activation_backward(f, x, dy, dx);
    const Tensor y_gpu = Tensor::empty({n}, DType::f32, kGpu), dx_gpu = y_gpu.clone();
    k::activation_forward(f, x.to(kGpu), y_gpu);
    k::activation_backward(f, x.to(kGpu), dy.to(kGpu), dx_gpu);
    require_close(y_gpu, y, 1e-6, 1e-6);
    require_close(dx_gpu, dx, 1e-6, 1e-6);

    const Tensor y16 = Tensor::empty({n}, DType::bf16, kGpu);
    k::activation_forward(f, x.to(DType::bf16).to(kGpu), y16);
    const Tensor ref = Tensor::empty({n});
    k::activation_forward(f, x.to(DType::bf16).to(DType::f32), ref);
    require_close(y16.to(DType::f32), ref, 1.0 / 128, 1e-6);
  }
}

TEST_CASE("CUDA layer_norm matches the host", "[cuda][layer_norm]") {
  for (const int64_t cols : {1, 31, 256, 1000}) {
    const int64_t rows = 19;
    const Tensor x = loom::test::random_tensor({rows, cols}, DType::f32, 5, -3.0f, 5.0f);
    const Tensor w = loom::test::random_tensor({cols}, DType::f32, 6);
    const Tensor b = loom::test::random_tensor({cols}, DType::f32, 7);
    const Tensor dy = loom::test::random_tensor({rows, cols}, DType::f32, 8);
    const Tensor y = Tensor::empty({rows, cols}), mean = Tensor::empty({rows}),
                 rstd = Tensor::empty({rows}), dx = Tensor::empty({rows, cols}),
                 dw = Tensor::empty({cols}), db = Tensor::empty({cols});
    k::layer_norm_forward(x, w, b, 1e-5f, y, mean, rstd);
    k::layer_norm_backward_input(dy, x, w, mean, rstd, dx);
    k::layer_norm_backward_weight(dy, x, mean, rstd, dw, db, false);

    const Tensor xg = x.to(kGpu), dyg = dy.to(kGpu), wg = w.to(kGpu);
    const Tensor yg = y.to(kGpu), meang = mean.to(kGpu), rstdg = rstd.to(kGpu), dxg = dx.to(kGpu),
                 dwg = dw.to(kGpu), dbg = db.to(kGpu);
    k::layer_norm_forward(xg, wg, b.to(kGpu), 1e-5f, yg, meang, rstdg);
    k::layer_norm_backward_input(dyg, xg, wg, meang, rstdg, dxg);
    k::layer_norm_backward_weight(dyg, xg, meang, rstdg, dwg, dbg, false);
    INFO("cols " << cols);
    require_close(yg, y, 1e-5, 1e-5);
    require_close(meang, mean, 1e-5, 1e-6);
    require_close(rstdg, rstd, 1e-5, 1e-6);
    require_close(dxg, dx, 1e-4, 1e-4);
    require_close(dwg, dw, 1e-5, 1e-5);
    require_close(dbg, db, 1e-5, 1e-5);
  }
}

// 8192 x 768 (a GPT-2 width over 8K tokens): enough rows that bias_grad and
// layer norm's weight gradient split the rows into several slabs (NOTE [split
// reductions] in kernels/cuda/bias.cu) on any device with 8 SMs or more.
TEST_CASE("CUDA bias_grad over many rows gives the host's bits, for every dtype pair",
          "[cuda][bias]") {
  // Multiples of 1/16 in [-1, 1]: every partial sum of them, and of two
  // passes, is exact in f32 (at most 2^14 in steps of 2^-4: 18 bits), whatever
  // the slabs, and bf16 and f16 hold the values exactly; so the device must
  // give the host's bits, rounded once where db is 16-bit.
  const int64_t rows = 8192, cols = 768;
  std::vector<float> values = loom::test::random_values(rows * cols, 31);
  for (float& v : values) v = std::round(v * 16.0f) / 16.0f;
  const Tensor dy = Tensor::from_vector(values, {rows, cols});
  const Tensor once = Tensor::empty({cols});
  k::bias_grad(dy, once, false);
  struct Pair {
    DType dy, db;
  };
  for (const Pair pair :
       {Pair{DType::f32, DType::f32}, Pair{DType::bf16, DType::f32}, Pair{DType::f16, DType::f32},
        Pair{DType::bf16, DType::bf16}, Pair{DType::f16, DType::f16}}) {
    INFO("dy " << pair.dy << ", db " << pair.db);
    // What db holds after one sum and after a second one added to it: the
    // exact sum rounded to db's dtype, then (rounded + exact) rounded.
    const Tensor want_once = once.to(pair.db).to(DType::f32);
    std::vector<float> twice = want_once.to_vector<float>();
    const std::vector<float> exact = once.to_vector<float>();
    for (size_t c = 0; c < twice.size(); ++c) twice[c] += exact[c];
    const Tensor want_twice = Tensor::from_vector(twice, {cols}).to(pair.db).to(DType::f32);

    const Tensor gdy = dy.to(pair.dy).to(kGpu);
    const Tensor gdb = Tensor::empty({cols}, pair.db, kGpu);
    k::bias_grad(gdy, gdb, false);
    REQUIRE(loom::test::first_difference(gdb.to(DType::f32).to_vector<float>(),
                                         want_once.to_vector<float>()) == -1);
    k::bias_grad(gdy, gdb, true);  // a later micro-batch's accumulation
    REQUIRE(loom::test::first_difference(gdb.to(DType::f32).to_vector<float>(),
                                         want_twice.to_vector<float>()) == -1);
  }
}

TEST_CASE("CUDA layer_norm backward_weight over many rows matches the host and repeats its bits",
          "[cuda][layer_norm]") {
  const int64_t rows = 8192, cols = 768;
  const Tensor x = loom::test::random_tensor({rows, cols}, DType::f32, 41, -3.0f, 5.0f);
  const Tensor w = loom::test::random_tensor({cols}, DType::f32, 42);
  const Tensor b = loom::test::random_tensor({cols}, DType::f32, 43);
  const Tensor dy = loom::test::random_tensor({rows, cols}, DType::f32, 44);
  const Tensor y = Tensor::empty({rows, cols}), mean = Tensor::empty({rows}),
               rstd = Tensor::empty({rows}), dw = Tensor::empty({cols}), db = Tensor::empty({cols});
  k::layer_norm_forward(x, w, b, 1e-5f, y, mean, rstd);
  k::layer_norm_backward_weight(dy, x, mean, rstd, dw, db, false);

  // The device gets the host's statistics, so both sum the same terms.
  const Tensor xg = x.to(kGpu), dyg = dy.to(kGpu), meang = mean.to(kGpu), rstdg = rstd.to(kGpu);
  const Tensor dwg = Tensor::empty({cols}, DType::f32, kGpu), dbg = dwg.clone();
  const Tensor dwg2 = dwg.clone(), dbg2 = dwg.clone();
  k::layer_norm_backward_weight(dyg, xg, meang, rstdg, dwg, dbg, false);
  k::layer_norm_backward_weight(dyg, xg, meang, rstdg, dwg2, dbg2, false);
  // The host adds 8192 rows one after the other in f32: its rounding error
  // grows to ~1e-4 (a random walk of 8192 roundings at sums of ~50); the
  // device's, over slabs of a few hundred rows, stays far below.
  const double atol = 2e-3;
  require_close(dwg, dw, 1e-5, atol);
  require_close(dbg, db, 1e-5, atol);
  // Deterministic: a second run gives the same bits.
  REQUIRE(loom::test::first_difference(dwg2.to_vector<float>(), dwg.to_vector<float>()) == -1);
  REQUIRE(loom::test::first_difference(dbg2.to_vector<float>(), dbg.to_vector<float>()) == -1);

  // accumulate adds on top.
  k::layer_norm_backward_weight(dy, x, mean, rstd, dw, db, true);
  k::layer_norm_backward_weight(dyg, xg, meang, rstdg, dwg, dbg, true);
  require_close(dwg, dw, 1e-5, 2 * atol);
  require_close(dbg, db, 1e-5, 2 * atol);
}

// Two shapes: few ids repeated many times, and GPT-2's (8192 tokens of a
// 50304-row table, one id taking a quarter of them, the rest spread).
TEST_CASE("CUDA embedding matches the host and its backward is deterministic",
          "[cuda][embedding]") {
  struct Shape3 {
    int64_t vocab, dim, count;
  };
  for (const Shape3 shape : {Shape3{3000, 96, 5000}, Shape3{50304, 768, 8192}}) {
    const int64_t vocab = shape.vocab, dim = shape.dim, count = shape.count;
    INFO("vocab " << vocab << ", dim " << dim << ", " << count << " ids");
    const Tensor table = loom::test::random_tensor({vocab, dim}, DType::f32, 9);
    std::vector<int64_t> ids(count);
    for (int64_t i = 0; i < count; ++i) {
      ids[i] = vocab < 10000 ? (i * 7919) % 97 : (i % 4 == 0 ? 50256 : (i * 7919) % vocab);
    }
    for (const DType id_dtype : {DType::i32, DType::i64}) {
      INFO("ids " << id_dtype);
      const Tensor id_tensor = Tensor::from_vector(ids, {count}).to(id_dtype);
      const Tensor out = Tensor::empty({count, dim});
      k::embedding_forward(table, id_tensor, out);
      const Tensor out_gpu = Tensor::empty({count, dim}, DType::f32, kGpu);
      k::embedding_forward(table.to(kGpu), id_tensor.to(kGpu), out_gpu);
      require_close(out_gpu, out, 0, 0);

      const Tensor dy = loom::test::random_tensor({count, dim}, DType::f32, 10);
      const Tensor dtable = Tensor::empty({vocab, dim});
      k::embedding_backward(dy, id_tensor, dtable, false);
      const Tensor first = Tensor::empty({vocab, dim}, DType::f32, kGpu), second = first.clone();
      k::embedding_backward(dy.to(kGpu), id_tensor.to(kGpu), first, false);
      k::embedding_backward(dy.to(kGpu), id_tensor.to(kGpu), second, false);
      // Same order of additions as the host: equal bits.
      require_close(first, dtable, 0, 0);
      require_close(second, first, 0, 0);
      // A second micro-batch's contributions added to the first's, likewise.
      k::embedding_backward(dy, id_tensor, dtable, true);
      k::embedding_backward(dy.to(kGpu), id_tensor.to(kGpu), first, true);
      require_close(first, dtable, 0, 0);
    }
  }
}

TEST_CASE("CUDA index_select copies rows of every dtype bit for bit and its backward matches",
          "[cuda][index_select]") {
  const int64_t rows = 500, count = 700;
  std::vector<int64_t> picks(count);
  for (int64_t i = 0; i < count; ++i) picks[i] = (i * 7919) % rows;  // unsorted, repeated
  const Tensor index = Tensor::from_vector(picks, {count}).to(DType::i32);
  const Tensor images = loom::test::random_tensor({rows, 1, 8, 8}, DType::f32, 12);
  std::vector<int64_t> label_values(rows);
  for (int64_t r = 0; r < rows; ++r) label_values[r] = r * 1000003 - 250;
  const Tensor labels64 = Tensor::from_vector(label_values, {rows});
  for (const Tensor& src :
       {images, labels64.to(DType::i32), labels64, images.view({rows, 64}).to(DType::bf16)}) {
    INFO(src.str());
    const Tensor host = k::index_select(src, index);
    const Tensor device = k::index_select(src.to(kGpu), index.to(kGpu));
    REQUIRE(device.dtype() == src.dtype());
    REQUIRE(device.to(DType::f32).to(Device::cpu()).to_vector<float>() ==
            host.to(DType::f32).to_vector<float>());
  }
  REQUIRE(k::index_select(labels64.to(kGpu), index.to(kGpu)).to_vector<int64_t>() ==
          k::index_select(labels64, index).to_vector<int64_t>());

  const Tensor dout = loom::test::random_tensor({count, 1, 8, 8}, DType::f32, 13);
  const Tensor dsrc = Tensor::empty({rows, 1, 8, 8});
  k::index_select_backward(dout, index, dsrc, false);
  const Tensor dsrc_gpu = Tensor::empty({rows, 1, 8, 8}, DType::f32, kGpu);
  k::index_select_backward(dout.to(kGpu), index.to(kGpu), dsrc_gpu, false);
  require_close(dsrc_gpu, dsrc, 0, 0);  // same order of additions: equal bits
}

TEST_CASE("CUDA cross_entropy matches the host, f32 and bf16 logits", "[cuda][cross_entropy]") {
  const int64_t rows = 67, classes = 5003;
  std::vector<int32_t> targets(rows);
  for (int64_t r = 0; r < rows; ++r) targets[r] = r % 5 == 2 ? -1 : int32_t((r * 131) % classes);
  const Tensor t = Tensor::from_vector(targets, {rows});
  for (const DType dtype : {DType::f32, DType::bf16}) {
    INFO("logits " << dtype);
    // bf16 logits are widened exactly on both sides; a gradient rounded once to
    // bf16 may land one bf16 step (2^-8 relative) apart.
    const double grad_rtol = dtype == DType::f32 ? 1e-5 : 8e-3;
    const Tensor logits =
        loom::test::random_tensor({rows, classes}, DType::f32, 11, -8.0f, 8.0f).to(dtype);
    const Tensor loss = Tensor::empty({1}), lse = Tensor::empty({rows}), count = Tensor::empty({1});
    k::cross_entropy_forward(logits, t, loss, lse, count);
    const Tensor lg = logits.to(kGpu), tg = t.to(kGpu);
    const Tensor loss_g = loss.to(kGpu), lse_g = lse.to(kGpu), count_g = count.to(kGpu);
    k::cross_entropy_forward(lg, tg, loss_g, lse_g, count_g);
    require_close(loss_g, loss, 1e-5, 0);
    require_close(lse_g, lse, 1e-6, 1e-6);
    require_close(count_g, count, 0, 0);

    const Tensor d = Tensor::empty({rows, classes}, dtype);
    k::cross_entropy_backward(logits, t, lse, count, 2.0f, d);
    const Tensor dg = Tensor::empty({rows, classes}, dtype, kGpu);
    k::cross_entropy_backward(lg, tg, lse_g, count_g, 2.0f, dg);
    require_close(dg.to(DType::f32), d.to(DType::f32), grad_rtol, 1e-9);
    // In place: the logits become their gradient.
    k::cross_entropy_backward(lg, tg, lse_g, count_g, 2.0f, lg);
    require_close(lg.to(DType::f32), d.to(DType::f32), grad_rtol, 1e-9);
  }
}

TEST_CASE("CUDA vocabulary-parallel cross-entropy pieces match the host, f32 and bf16",
          "[cuda][cross_entropy]") {
  // 19 rows of a rank's 3001 columns, 2990 valid (the rest padding); targets
  // here, on another rank, and ignored rows.
  const int64_t rows = 19, columns = 3001, valid = 2990;
  std::vector<int64_t> column(rows);
  for (int64_t r = 0; r < rows; ++r) {
    column[r] = r % 4 == 0 ? k::kIgnoredRow : r % 4 == 1 ? k::kNotHere : (r * 157) % valid;
  }
  const Tensor columns_t = Tensor::from_vector(column, {rows});
  for (const DType dtype : {DType::f32, DType::bf16}) {
    INFO("logits " << dtype);
    const double grad_rtol = dtype == DType::f32 ? 1e-5 : 8e-3;
    const Tensor logits =
        loom::test::random_tensor({rows, columns}, DType::f32, 31, -8.0f, 8.0f).to(dtype);
    const Tensor lg = logits.to(kGpu), cg = columns_t.to(kGpu);
    const Tensor max = Tensor::empty({rows}), max_g = Tensor::empty({rows}, DType::f32, kGpu);
    k::cross_entropy_row_max(logits, valid, max);
    k::cross_entropy_row_max(lg, valid, max_g);
    require_close(max_g, max, 0, 0);  // the same values' maximum
    const Tensor sums = Tensor::empty({rows}), sums_g = Tensor::empty({rows}, DType::f32, kGpu);
    k::cross_entropy_row_sum_exp(logits, valid, max, sums);
    k::cross_entropy_row_sum_exp(lg, valid, max_g, sums_g);
    require_close(sums_g, sums, 1e-5, 0);
    const Tensor picked = Tensor::empty({rows}), picked_g = Tensor::empty({rows}, DType::f32, kGpu);
    k::cross_entropy_row_pick(logits, columns_t, picked);
    k::cross_entropy_row_pick(lg, cg, picked_g);
    require_close(picked_g, picked, 0, 0);
    std::vector<float> lse(rows);
    for (int64_t r = 0; r < rows; ++r) {
      lse[r] = max.data<float>()[r] + std::log(sums.data<float>()[r]);
    }
    const Tensor lse_t = Tensor::from_vector(lse, {rows});
    const Tensor d = Tensor::empty({rows, columns}, dtype);
    k::cross_entropy_row_gradient(logits, valid, lse_t, columns_t, 0.125f, d);
    const Tensor dg = Tensor::full({rows, columns}, 7.0, dtype, kGpu);
    k::cross_entropy_row_gradient(lg, valid, lse_t.to(kGpu), cg, 0.125f, dg);
    require_close(dg.to(DType::f32), d.to(DType::f32), grad_rtol, 1e-9);
    k::cross_entropy_row_gradient(lg, valid, lse_t.to(kGpu), cg, 0.125f, lg);  // in place
    require_close(lg.to(DType::f32), d.to(DType::f32), grad_rtol, 1e-9);
  }
}

TEST_CASE("CUDA dropout draws the host's mask, bit for bit", "[cuda][dropout]") {
  for (const int64_t n : {1, 5, 100003}) {
    const Tensor x = loom::test::random_tensor({n}, DType::f32, 12);
    const Tensor y = Tensor::empty({n}), y_gpu = Tensor::empty({n}, DType::f32, kGpu);
    k::dropout_forward(x, 0.37f, RandomKey{3, 4}, y);
    k::dropout_forward(x.to(kGpu), 0.37f, RandomKey{3, 4}, y_gpu);
    REQUIRE(loom::test::first_difference(y_gpu.to_vector<float>(), y.to_vector<float>()) == -1);
    const Tensor dx_gpu = Tensor::empty({n}, DType::f32, kGpu);
    k::dropout_backward(x.to(kGpu), 0.37f, RandomKey{3, 4}, dx_gpu);
    REQUIRE(loom::test::first_difference(dx_gpu.to_vector<float>(), y.to_vector<float>()) == -1);
  }
}

TEST_CASE("CUDA dropout of a slice with an index offset draws the host's slice mask",
          "[cuda][dropout]") {
  // Sequence parallelism's token slices: every phase of the four-element groups.
  const int64_t n = 1000;
  const Tensor x = loom::test::random_tensor({n}, DType::f32, 13);
  const Tensor whole = Tensor::empty({n});
  k::dropout_forward(x, 0.3f, RandomKey{9, 4}, whole);
  const std::vector<float> expected = whole.to_vector<float>();
  for (const int64_t offset :
       {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{3}, int64_t{5}, int64_t{997}}) {
    for (const int64_t length : {int64_t{1}, int64_t{3}, int64_t{70}, n - offset}) {
      if (offset + length > n) continue;
      INFO("offset " << offset << ", length " << length);
      const Tensor slice = x.flat_view(offset, {length}).to(kGpu);
      const Tensor y = Tensor::empty({length}, DType::f32, kGpu);
      k::dropout_forward(slice, 0.3f, RandomKey{9, 4}, y, offset);
      const std::vector<float> got = y.to_vector<float>();
      REQUIRE(std::equal(got.begin(), got.end(), expected.begin() + offset));
    }
  }
}
