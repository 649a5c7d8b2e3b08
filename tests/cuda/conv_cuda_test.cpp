// The convolution stack on CUDA against the host: conv2d through cuDNN (f32
// to a tolerance relative to the dot-product length, bf16 looser), the
// batch_norm steps (sums in double on both sides: to 1e-5; also with
// thousands of values per channel, split over several blocks), pooling (max
// exactly, averages to 1e-6), and Conv2d + BatchNorm2d modules end to end.
#include <catch2/catch.hpp>

#include <cmath>
#include <utility>
#include <vector>

#include "../kernels/kernel_test_util.hpp"
#include "loom/kernels/batch_norm.hpp"
#include "loom/kernels/conv2d.hpp"
#include "loom/kernels/pool2d.hpp"
#include "loom/nn/batch_norm.hpp"
#include "loom/nn/conv2d.hpp"
#include "support/compare.hpp"

using loom::Device;
using loom::DType;
using loom::Shape;
using loom::Tensor;
namespace k = loom::kernels;

namespace {

const Device kGpu = Device::cuda(0);

// |device - host| <= tol * (1 + |host|) per element.
void check_close(const char* what, const Tensor& device, const Tensor& host, double tol) {
  INFO(what);
  REQUIRE(loom::test::out_of_tolerance(device.to_vector<float>(), host.to_vector<float>(), tol,
                                       tol) == "");
}

Tensor empty_like(const Tensor& t, Device device) {
  return Tensor::empty(t.shape(), t.dtype(), device);
}

}  // namespace

TEST_CASE("cuDNN conv2d matches the host in every pass") {
  struct Case {
    Shape x, w;
    k::Conv2dParams params;
  };
  const Case cases[] = {{{4, 16, 16, 16}, {32, 16, 3, 3}, {1, 1}},
                        {{3, 8, 15, 13}, {16, 8, 3, 3}, {2, 1}},
                        {{2, 3, 32, 32}, {8, 3, 7, 7}, {2, 3}},
                        {{5, 32, 8, 8}, {16, 32, 1, 1}, {1, 0}},
                        {{2, 16, 9, 9}, {8, 16, 1, 1}, {2, 0}}};
  for (const Case& c : cases) {
    INFO("x " << loom::shape_str(c.x) << " w " << loom::shape_str(c.w) << " stride "
              << c.params.stride << " padding " << c.params.padding);
    const Shape ys = k::conv2d_output_shape(c.x, c.w, c.params);
    const Tensor x = loom::test::random_tensor(c.x, DType::f32, 1);
    const Tensor w = loom::test::random_tensor(c.w, DType::f32, 2);
    const Tensor bias = loom::test::random_tensor({c.w[0]}, DType::f32, 3);
    const Tensor dy = loom::test::random_tensor(ys, DType::f32, 4);
    const double depth = static_cast<double>(c.w[1] * c.w[2] * c.w[3] + ys[0] * ys[2] * ys[3]);
    for (DType dtype : {DType::f32, DType::bf16}) {
      INFO("dtype " << dtype);
      // f32: both sides accumulate in f32; bf16: inputs and outputs rounded to 8 bits.
      const double tol = dtype == DType::f32 ? 4e-7 * depth : 2e-2 + 4e-3 * std::sqrt(depth);
      const Tensor hx = x.to(dtype).to(DType::f32), hw = w.to(dtype).to(DType::f32);
      const Tensor hb = bias.to(dtype).to(DType::f32), hdy = dy.to(dtype).to(DType::f32);
      const Tensor y = Tensor::empty(ys), dx = empty_like(x, Device::cpu());
      const Tensor dw = empty_like(w, Device::cpu()), db = Tensor::empty({c.w[0]});
      k::conv2d_forward(hx, hw, hb, y, c.params);
      k::conv2d_backward_input(hdy, hw, dx, c.params);
      k::conv2d_backward_weight(hx, hdy, dw, db, c.params, false);

      const Tensor gx = x.to(dtype).to(kGpu), gw = w.to(dtype).to(kGpu);
      const Tensor gb = bias.to(dtype).to(kGpu), gdy = dy.to(dtype).to(kGpu);
      const Tensor gy = Tensor::empty(ys, dtype, kGpu), gdx = empty_like(gx, kGpu);
      const Tensor gdw = empty_like(gw, kGpu), gdb = Tensor::empty({c.w[0]}, dtype, kGpu);
      k::conv2d_forward(gx, gw, gb, gy, c.params);
      k::conv2d_backward_input(gdy, gw, gdx, c.params);
      k::conv2d_backward_weight(gx, gdy, gdw, gdb, c.params, false);
      check_close("y", gy.to(DType::f32), y, tol);
      check_close("dx", gdx.to(DType::f32), dx, tol);
      check_close("dw", gdw.to(DType::f32), dw, tol);
      check_close("db", gdb.to(DType::f32), db, tol);

      // accumulate adds on top.
      k::conv2d_backward_weight(gx, gdy, gdw, gdb, c.params, true);
      k::conv2d_backward_weight(hx, hdy, dw, db, c.params, true);
      check_close("dw accumulated", gdw.to(DType::f32), dw, 2 * tol);
      check_close("db accumulated", gdb.to(DType::f32), db, 2 * tol);
    }
  }
}

// ConvAlgorithmSearch::measured times cuDNN's candidates on a scratch output:
// the results still match the host, and a weight gradient that accumulates
// from its first call (the search runs then) is added once.
TEST_CASE("conv2d's measured algorithm search matches the host and accumulates once") {
  struct Restore {
    ~Restore() { k::set_conv_algorithm_search(k::ConvAlgorithmSearch::heuristic); }
  } restore;
  k::set_conv_algorithm_search(k::ConvAlgorithmSearch::measured);
  REQUIRE(k::conv_algorithm_search() == k::ConvAlgorithmSearch::measured);
  const k::Conv2dParams params{1, 1};
  const Shape xs{3, 12, 11, 11}, ws{10, 12, 3, 3};  // shapes no other test uses
  const Shape ys = k::conv2d_output_shape(xs, ws, params);
  const Tensor x = loom::test::random_tensor(xs, DType::f32, 21);
  const Tensor w = loom::test::random_tensor(ws, DType::f32, 22);
  const Tensor dy = loom::test::random_tensor(ys, DType::f32, 23);
  const Tensor before = loom::test::random_tensor(ws, DType::f32, 24);
  const double depth = static_cast<double>(ws[1] * ws[2] * ws[3] + ys[0] * ys[2] * ys[3]);
  const double tol = 4e-7 * depth;

  const Tensor y = Tensor::empty(ys), dx = empty_like(x, Device::cpu()), dw = before.clone();
  k::conv2d_forward(x, w, Tensor(), y, params);
  k::conv2d_backward_input(dy, w, dx, params);
  k::conv2d_backward_weight(x, dy, dw, Tensor(), params, true);

  const Tensor gx = x.to(kGpu), gw = w.to(kGpu), gdy = dy.to(kGpu);
  const Tensor gy = Tensor::empty(ys, DType::f32, kGpu), gdx = empty_like(gx, kGpu);
  const Tensor gdw = before.to(kGpu);
  k::conv2d_forward(gx, gw, Tensor(), gy, params);
  k::conv2d_backward_input(gdy, gw, gdx, params);
  k::conv2d_backward_weight(gx, gdy, gdw, Tensor(), params, true);
  check_close("y", gy, y, tol);
  check_close("dx", gdx, dx, tol);
  check_close("dw accumulated once", gdw, dw, 2 * tol);
}

TEST_CASE("conv2d with bf16 operands of an f32 weight on CUDA matches the host's") {
  // Mixed precision (Conv2dParams::operands = bf16): the f32 weight and an f32
  // input rounded to bf16, f32 accumulation. CUDA rounds every result to bf16
  // once (NOTE [bf16 operands on CUDA] in kernels/conv2d.cpp), the host only
  // those whose tensor is bf16; both within bf16's tolerance of each other.
  const Shape xs{3, 16, 12, 12}, ws{24, 16, 3, 3};
  k::Conv2dParams params{1, 1};
  params.operands = DType::bf16;
  const Shape ys = k::conv2d_output_shape(xs, ws, params);
  const Tensor x = loom::test::random_tensor(xs, DType::f32, 21);
  const Tensor w = loom::test::random_tensor(ws, DType::f32, 22);
  const Tensor bias = loom::test::random_tensor({ws[0]}, DType::f32, 23);
  const Tensor dy = loom::test::random_tensor(ys, DType::f32, 24);
  const double depth = static_cast<double>(ws[1] * ws[2] * ws[3] + ys[0] * ys[2] * ys[3]);
  const double tol = 2e-2 + 4e-3 * std::sqrt(depth);
  // activations: the dtype of x, y, dy and dx (bf16 between layers; f32 for a stem).
  for (const DType activations : {DType::bf16, DType::f32}) {
    INFO("activations " << activations);
    const auto run = [&](Device d, Tensor& y, Tensor& dx, Tensor& dw, Tensor& db) {
      const Tensor dx_in = x.to(activations).to(d), ddy = dy.to(activations).to(d);
      const Tensor dw_in = w.to(d), dbias = bias.to(d);
      y = Tensor::empty(ys, activations, d);
      dx = Tensor::empty(xs, activations, d);
      dw = Tensor::empty(ws, DType::f32, d);
      db = Tensor::empty({ws[0]}, DType::f32, d);
      k::conv2d_forward(dx_in, dw_in, dbias, y, params);
      k::conv2d_backward_input(ddy, dw_in, dx, params);
      k::conv2d_backward_weight(dx_in, ddy, dw, db, params, false);
      k::conv2d_backward_weight(dx_in, ddy, dw, db, params, true);  // accumulates: twice
    };
    Tensor y, dx, dw, db, gy, gdx, gdw, gdb;
    run(Device::cpu(), y, dx, dw, db);
    run(kGpu, gy, gdx, gdw, gdb);
    REQUIRE(gy.dtype() == activations);
    check_close("y", gy.to(DType::f32), y.to(DType::f32), tol);
    check_close("dx", gdx.to(DType::f32), dx.to(DType::f32), tol);
    check_close("dw (twice)", gdw, dw, 2 * tol);
    check_close("db (twice)", gdb, db, 1e-4 * depth);
  }
}

TEST_CASE("CUDA batch_norm steps match the host, f32 and bf16 activations") {
  const Shape shape{4, 6, 5, 7};
  const Tensor x = loom::test::random_tensor(shape, DType::f32, 5, -1.0f, 2.0f);
  const Tensor dy = loom::test::random_tensor(shape, DType::f32, 6);
  const Tensor weight = loom::test::random_tensor({6}, DType::f32, 7, 0.5f, 1.5f);
  const Tensor bias = loom::test::random_tensor({6}, DType::f32, 8);
  struct Run {
    Tensor sums, mean, invstd, rm, rv, y, grad_sums, dx, eval_mean, eval_invstd, eval_dx;
  };
  for (const DType dtype : {DType::f32, DType::bf16}) {
    INFO("activations " << dtype);
    const auto run = [&](Device d) {
      Run r;
      const Tensor dx_in = x.to(dtype).to(d), ddy = dy.to(dtype).to(d);
      const Tensor dw = weight.to(d), dbias = bias.to(d);
      r.sums = Tensor::empty({2, 6}, DType::f32, d);
      r.mean = Tensor::empty({6}, DType::f32, d);
      r.invstd = Tensor::empty({6}, DType::f32, d);
      r.rm = Tensor::full({6}, 0.5, DType::f32, d);
      r.rv = Tensor::full({6}, 2.0, DType::f32, d);
      r.y = Tensor::empty(shape, dtype, d);
      r.grad_sums = Tensor::empty({2, 6}, DType::f32, d);
      r.dx = Tensor::empty(shape, dtype, d);
      k::batch_norm_stats(dx_in, r.sums);
      k::batch_norm_finalize(r.sums, 140, 1e-5f, 0.1f, r.mean, r.invstd, r.rm, r.rv);
      k::batch_norm_normalize(dx_in, r.mean, r.invstd, dw, dbias, r.y);
      k::batch_norm_backward_sums(ddy, dx_in, r.mean, r.invstd, r.grad_sums);
      k::batch_norm_backward_input(ddy, dx_in, r.mean, r.invstd, dw, r.grad_sums, 140, true, r.dx);
      r.eval_mean = Tensor::empty({6}, DType::f32, d);
      r.eval_invstd = Tensor::empty({6}, DType::f32, d);
      r.eval_dx = Tensor::empty(shape, dtype, d);
      k::batch_norm_eval_stats(r.rm, r.rv, 1e-5f, r.eval_mean, r.eval_invstd);
      k::batch_norm_backward_input(ddy, dx_in, r.eval_mean, r.eval_invstd, dw, Tensor(), 0, false,
                                   r.eval_dx);
      return r;
    };
    const Run host = run(Device::cpu()), gpu = run(kGpu);
    // The sums see the same (bf16-exact) values on both sides: f32 tolerances. An
    // activation's value rounded once may land one bf16 step (2^-8 relative) apart.
    const double act = dtype == DType::f32 ? 1e-5 : 8e-3, eval = dtype == DType::f32 ? 1e-6 : 8e-3;
    check_close("sums", gpu.sums, host.sums, 1e-5);
    check_close("mean", gpu.mean, host.mean, 1e-5);
    check_close("invstd", gpu.invstd, host.invstd, 1e-5);
    check_close("running_mean", gpu.rm, host.rm, 1e-6);
    check_close("running_var", gpu.rv, host.rv, 1e-6);
    check_close("y", gpu.y.to(DType::f32), host.y.to(DType::f32), act);
    check_close("grad_sums", gpu.grad_sums, host.grad_sums, 1e-5);
    check_close("dx", gpu.dx.to(DType::f32), host.dx.to(DType::f32), act);
    check_close("eval invstd", gpu.eval_invstd, host.eval_invstd, 1e-6);
    check_close("eval dx", gpu.eval_dx.to(DType::f32), host.eval_dx.to(DType::f32), eval);
  }
}

TEST_CASE("CUDA batch_norm sums split over several blocks per channel match the host") {
  // Thousands of values per channel, so that each channel's sums split into
  // several ranges (NOTE [split reductions] in kernels/cuda/bias.cu); planes
  // of kBlock (256) positions, more (784) and fewer (49), for the walk that
  // tracks image and position without dividing.
  for (const Shape& shape : {Shape{32, 64, 16, 16}, Shape{8, 24, 28, 28}, Shape{64, 16, 7, 7}}) {
    const int64_t channels = shape[1], count = shape[0] * shape[2] * shape[3];
    const Tensor x = loom::test::random_tensor(shape, DType::f32, 51, -1.0f, 2.0f);
    const Tensor dy = loom::test::random_tensor(shape, DType::f32, 52);
    for (const DType dtype : {DType::f32, DType::bf16}) {
      INFO("x " << loom::shape_str(shape) << ", activations " << dtype);
      const Tensor hx = x.to(dtype), hdy = dy.to(dtype);
      const Tensor sums = Tensor::empty({2, channels}), grad_sums = Tensor::empty({2, channels});
      const Tensor mean = Tensor::empty({channels}), invstd = Tensor::empty({channels});
      k::batch_norm_stats(hx, sums);
      k::batch_norm_finalize(sums, count, 1e-5f, 0.1f, mean, invstd, Tensor(), Tensor());
      k::batch_norm_backward_sums(hdy, hx, mean, invstd, grad_sums);

      // The device gets the host's mean and invstd, so both sum the same terms.
      const Tensor gx = hx.to(kGpu), gdy = hdy.to(kGpu);
      const Tensor gmean = mean.to(kGpu), ginvstd = invstd.to(kGpu);
      const auto device_sums = [&] {
        const Tensor gsums = Tensor::empty({2, channels}, DType::f32, kGpu);
        const Tensor ggrad = Tensor::empty({2, channels}, DType::f32, kGpu);
        k::batch_norm_stats(gx, gsums);
        k::batch_norm_backward_sums(gdy, gx, gmean, ginvstd, ggrad);
        return std::make_pair(gsums, ggrad);
      };
      const auto [gsums, ggrad] = device_sums();
      check_close("sums", gsums, sums, 1e-5);
      // sum dy * xhat cancels towards 0 while each side rounds its f32 plane
      // sums (~1e-6 each): compare to 1e-4 (a wrong element would be off by ~1).
      check_close("grad_sums", ggrad, grad_sums, 1e-4);
      // Deterministic: a second run gives the same bits.
      const auto [gsums2, ggrad2] = device_sums();
      REQUIRE(loom::test::first_difference(gsums2.to_vector<float>(), gsums.to_vector<float>()) ==
              -1);
      REQUIRE(loom::test::first_difference(ggrad2.to_vector<float>(), ggrad.to_vector<float>()) ==
              -1);
    }
  }
}

TEST_CASE("CUDA pooling matches the host, f32 and bf16") {
  const Shape xs{3, 4, 13, 11};
  for (const DType dtype : {DType::f32, DType::bf16}) {
    INFO("dtype " << dtype);
    // Max pooling picks the same element; sums rounded once to bf16 may differ by
    // one bf16 step (2^-8 relative) where the order of the f32 sums differs.
    const double tol = dtype == DType::f32 ? 1e-6 : 8e-3;
    const Tensor x = loom::test::random_tensor(xs, DType::f32, 9).to(dtype);
    const auto widened = [](const Tensor& t) { return t.to(DType::f32); };
    for (const k::Pool2dParams& pp :
         {k::Pool2dParams{3, 2, 1}, k::Pool2dParams{2, 2, 0}, k::Pool2dParams{3, 1, 1}}) {
      INFO("kernel " << pp.kernel << " stride " << pp.stride << " padding " << pp.padding);
      const Shape ys = k::pool2d_output_shape(xs, pp);
      const Tensor dy = loom::test::random_tensor(ys, DType::f32, 10).to(dtype);
      const Tensor y = Tensor::empty(ys, dtype), arg = Tensor::empty(ys, DType::i32);
      const Tensor dx = Tensor::empty(xs, dtype);
      const Tensor gy = Tensor::empty(ys, dtype, kGpu), garg = Tensor::empty(ys, DType::i32, kGpu);
      const Tensor gdx = Tensor::empty(xs, dtype, kGpu);
      k::max_pool2d_forward(x, y, arg, pp);
      k::max_pool2d_forward(x.to(kGpu), gy, garg, pp);
      CHECK(widened(gy).to_vector<float>() == widened(y).to_vector<float>());
      CHECK(garg.to_vector<int32_t>() == arg.to_vector<int32_t>());
      k::max_pool2d_backward(dy, arg, dx, pp);
      k::max_pool2d_backward(dy.to(kGpu), garg, gdx, pp);
      check_close("max dx", widened(gdx), widened(dx), tol);
      k::avg_pool2d_forward(x, y, pp);
      k::avg_pool2d_forward(x.to(kGpu), gy, pp);
      check_close("avg y", widened(gy), widened(y), tol);
      k::avg_pool2d_backward(dy, dx, pp);
      k::avg_pool2d_backward(dy.to(kGpu), gdx, pp);
      check_close("avg dx", widened(gdx), widened(dx), tol);
    }
    const Tensor g = Tensor::empty({3, 4}, dtype), gg = Tensor::empty({3, 4}, dtype, kGpu);
    k::global_avg_pool_forward(x, g);
    k::global_avg_pool_forward(x.to(kGpu), gg);
    check_close("global y", widened(gg), widened(g), tol);
    const Tensor dx = Tensor::empty(xs, dtype), gdx = Tensor::empty(xs, dtype, kGpu);
    k::global_avg_pool_backward(g, dx);
    k::global_avg_pool_backward(g.to(kGpu), gdx);
    check_close("global dx", widened(gdx), widened(dx), tol);
  }
}

TEST_CASE("Conv2d and BatchNorm2d run on CUDA like on the host") {
  loom::nn::Conv2dOptions on_gpu{.stride = 2, .padding = 1, .bias = true};
  on_gpu.module.device = kGpu;
  loom::nn::Conv2d host_conv("c", 3, 8, 3, {.stride = 2, .padding = 1, .bias = true});
  loom::nn::Conv2d gpu_conv("c", 3, 8, 3, on_gpu);
  CHECK(gpu_conv.weight().value().to_vector<float>() ==
        host_conv.weight().value().to_vector<float>());
  loom::nn::BatchNormOptions bn_gpu;
  bn_gpu.module.device = kGpu;
  loom::nn::BatchNorm2d host_bn("bn", 8), gpu_bn("bn", 8, bn_gpu);

  const Tensor x = loom::test::random_tensor({4, 3, 12, 12}, DType::f32, 11);
  const Tensor dy = loom::test::random_tensor({4, 8, 6, 6}, DType::f32, 12);
  loom::nn::Tape htape, gtape;
  const Tensor hy = host_bn.forward(host_conv.forward(x, htape), htape);
  const Tensor gyv = gpu_bn.forward(gpu_conv.forward(x.to(kGpu), gtape), gtape);
  check_close("y", gyv, hy, 1e-4);
  host_conv.zero_grad();
  host_bn.zero_grad();
  gpu_conv.zero_grad();
  gpu_bn.zero_grad();
  const Tensor hdx = host_conv.backward(host_bn.backward(dy, htape), htape);
  const Tensor gdx = gpu_conv.backward(gpu_bn.backward(dy.to(kGpu), gtape), gtape);
  check_close("dx", gdx, hdx, 1e-4);
  check_close("conv dw", gpu_conv.weight().grad(), host_conv.weight().grad(), 1e-4);
  check_close("bn dw", gpu_bn.weight().grad(), host_bn.weight().grad(), 1e-4);
  check_close("running_var", gpu_bn.running_var(), host_bn.running_var(), 1e-5);
}
