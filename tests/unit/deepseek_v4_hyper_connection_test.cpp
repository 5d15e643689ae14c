// DeepSeek-V4's mHC modules (models/deepseek_v4/hyper_connection.h) against transformers'
// DeepseekV4HyperConnection / DeepseekV4HyperHead (tests/fixtures/v4_hyper_connection.safetensors,
// made by reference/v4_hyper_connection_fixture.py): with random parameters on 5 tokens of
// 4 streams x 12, the post, comb (20 Sinkhorn iterations), collapsed input, the decoder layer's
// merge and the head's output, and the gradients of a probe loss with respect to the streams, the
// block output and every parameter, each to 1e-5 relative (Frobenius) in f32. Also the shapes a
// caller gets wrong, refused with the shape it needs.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "common/error_of.h"
#include "common/relative_error.h"
#include "titan/autograd/ops.h"
#include "titan/checkpoint/safetensors.h"
#include "titan/models/deepseek_v4/hyper_connection.h"

using namespace titan;
namespace v4 = titan::models::deepseek_v4;
using autograd::Variable;

namespace {

constexpr const char* kFixture = "tests/fixtures/v4_hyper_connection.safetensors";

Variable probed(const Variable& x, const Tensor& probe) { return autograd::sum(autograd::mul(x, Variable(probe))); }

v4::HyperConnectionArgs fixture_args() {
  v4::HyperConnectionArgs a;
  a.streams = 4, a.dim = 12, a.sinkhorn_iters = 20;
  return a;
}

}  // namespace

TEST(DeepSeekV4HyperConnection, MatchesTransformersForwardAndBackward) {
  const auto golden = checkpoint::SafetensorsFile::open(kFixture);
  v4::HyperConnection hc(fixture_args());
  v4::HyperHead head(fixture_args());
  for (const auto& [name, p] : {std::pair{"hc.fn", &hc.fn}, {"hc.base", &hc.base}, {"hc.scale", &hc.scale},
                                {"head.fn", &head.fn}, {"head.base", &head.base}, {"head.scale", &head.scale}})
    p->var.mutable_value().copy_(golden.get(name));
  Variable streams(golden.get("streams").clone(), true), block_out(golden.get("block_out").clone(), true);

  const v4::HyperConnection::Mixing mixing = hc.forward(streams);
  const Variable merged = v4::HyperConnection::merge(streams, block_out, mixing);
  const Variable y = head.forward(streams);
  for (const auto& [name, got] : {std::pair{"out.post", &mixing.post}, {"out.comb", &mixing.comb},
                                  {"out.collapsed", &mixing.collapsed}, {"out.merged", &merged}, {"out.head", &y}})
    EXPECT_LT(test::relative_error(got->value(), golden.get(name)), 1e-5) << name;

  Variable loss = autograd::add(autograd::add(probed(merged, golden.get("probe_merged")),
                                              probed(mixing.collapsed, golden.get("probe_collapsed"))),
                                probed(y, golden.get("probe_head")));
  autograd::backward(loss);
  for (const auto& [name, var] : {std::pair{"grad.streams", &streams}, {"grad.block_out", &block_out},
                                  {"grad.hc.fn", &hc.fn.var}, {"grad.hc.base", &hc.base.var},
                                  {"grad.hc.scale", &hc.scale.var}, {"grad.head.fn", &head.fn.var},
                                  {"grad.head.base", &head.base.var}, {"grad.head.scale", &head.scale.var}}) {
    ASSERT_TRUE(var->grad().defined()) << name;
    EXPECT_LT(test::relative_error(var->grad(), golden.get(name)), 1e-5) << name;
  }
}

TEST(DeepSeekV4HyperConnection, StreamsOfTheWrongShapeAreRefused) {
  v4::HyperConnection hc(fixture_args());
  const Variable flat(Tensor::zeros({5, 48}, DType::f32));
  const std::string e = test::error_of([&] { hc.forward(flat); });
  EXPECT_NE(e.find("[T, 4, 12]"), std::string::npos) << e;
  v4::HyperConnectionArgs bad = fixture_args();
  bad.sinkhorn_iters = 0;
  EXPECT_NE(test::error_of([&] { v4::HyperConnection h(bad); }).find("hc_sinkhorn_iters"), std::string::npos);
}
