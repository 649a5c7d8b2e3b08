// A ResNet built as a range of its layers (make_resnet(name, config, first,
// end)) holds and computes what the whole network does at those layers.
#include <catch2/catch.hpp>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "loom/core/random.hpp"
#include "loom/models/resnet.hpp"
#include "loom/nn/batch_norm.hpp"
#include "loom/parallel/sharded_module.hpp"
#include "loom/parallel/sync_batch_norm.hpp"

using loom::Tensor;
using loom::models::make_resnet;
using loom::models::resnet_layer_count;
using loom::models::ResNetConfig;
using loom::nn::Parameter;
using loom::nn::Tape;

namespace {

ResNetConfig small_resnet(loom::models::ResNetStem stem) {
  return loom::models::resnet18(
      {.stem = stem, .in_channels = 1, .classes = 5, .width = 4, .module = {.seed = 5}});
}

Tensor images(int64_t size) {
  Tensor x = Tensor::empty({2, 1, size, size});
  loom::fill_normal(x, loom::RandomKey{7, 1}, 0.0f, 1.0f);
  return x;
}

}  // namespace

TEST_CASE("ResNet parts: two ranges chained equal the whole network, forward and backward",
          "[model-parallel][resnet]") {
  for (auto stem : {loom::models::ResNetStem::cifar, loom::models::ResNetStem::imagenet}) {
    const ResNetConfig c = small_resnet(stem);
    const int64_t n = resnet_layer_count(c);
    // conv1 bn1 relu [maxpool] + 8 blocks + avgpool fc
    CHECK(n == (stem == loom::models::ResNetStem::cifar ? 13 : 14));
    auto whole = make_resnet("net", c);
    REQUIRE(static_cast<int64_t>(whole->size()) == n);
    const Tensor x = images(stem == loom::models::ResNetStem::cifar ? 8 : 32);
    Tape tape;
    const Tensor want = whole->forward(x, tape);
    Tensor dy = Tensor::empty(want.shape());
    loom::fill_normal(dy, loom::RandomKey{7, 2}, 0.0f, 1.0f);
    whole->backward(dy, tape);
    std::map<std::string, Parameter*> whole_params;
    for (Parameter* p : whole->parameters()) whole_params[p->name()] = p;

    for (int64_t cut : {int64_t{1}, n / 2, n - 1}) {
      INFO("cut at layer " << cut);
      auto first = make_resnet("net", c, 0, cut);
      auto second = make_resnet("net", c, cut, n);
      CHECK(static_cast<int64_t>(first->size() + second->size()) == n);
      Tape t1, t2;
      const Tensor got = second->forward(first->forward(x, t1), t2);
      CHECK(got.to_vector<float>() == want.to_vector<float>());
      first->backward(second->backward(dy, t2), t1);
      size_t params = 0;
      for (auto* part : {first.get(), second.get()}) {
        for (Parameter* p : part->parameters()) {
          INFO(p->name());
          ++params;
          CHECK(p->value().to_vector<float>() ==
                whole_params.at(p->name())->value().to_vector<float>());
          CHECK(p->grad().to_vector<float>() ==
                whole_params.at(p->name())->grad().to_vector<float>());
        }
      }
      CHECK(params == whole_params.size());
    }
  }
  const ResNetConfig c = small_resnet(loom::models::ResNetStem::cifar);
  CHECK_THROWS_WITH(make_resnet("net", c, 5, 14),
                    Catch::Contains("layers [5, 14) are not a range of its 13 layers"));
}

TEST_CASE("ResNet parts: BatchNorm layers are found inside any container, ShardedModule too",
          "[model-parallel][resnet]") {
  auto net = make_resnet("net", small_resnet(loom::models::ResNetStem::cifar));
  const size_t plain = loom::parallel::find_batch_norms(*net).size();
  CHECK(plain == 1 + 8 * 2 + 3);  // stem, two per block, three projected shortcuts
  loom::parallel::shard_children(*net);
  CHECK(loom::parallel::find_batch_norms(*net).size() == plain);
}
