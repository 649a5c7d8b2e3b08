// A program built outside Loom's tree against the installed package.
#include <loom/loom.hpp>

#include <cstdio>

int main() {
  const loom::Tensor a = loom::Tensor::full({2, 3}, 1.5f);
  loom::Tensor b = loom::Tensor::empty({2, 3});
  loom::fill_uniform(b, {7, loom::random_stream_id("b")}, -1.0f, 1.0f);
  const loom::Tensor c = a.to(loom::DType::bf16).to(loom::DType::f32);
  const float sum = c.to_vector<float>()[0] + c.to_vector<float>()[5];
  std::printf("loom %s, cuda %s, sum %.2f\n", LOOM_VERSION_STRING,
              loom::built_with_cuda() ? "yes" : "no", sum);
  if (sum != 3.0f) return 1;
  std::printf("consumer ok\n");
  return 0;
}
