// Module: registration order and names, traversal, modes, zero_grad, apply,
// to(dtype), state_dict / load_state_dict (strict errors), hooks, deep copy
// and printing.
#include "nn/module.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "autograd/grad_mode.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "multiprocessing/process.h"
#include "multiprocessing/sharing.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/conv.h"
#include "nn/linear.h"
#include "nn/normalization.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace ember::nn {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A module with typed children, a parameter and buffers of its own.
class Net : public Cloneable<Net> {
 public:
  Net() { reset(); }
  void reset() override {
    scale = register_parameter("scale", ones({1}));
    register_buffer("steps", zeros({}, TensorOptions(kInt64)));
    register_buffer("scratch", zeros({2}), /*persistent=*/false);
    fc1 = register_module("fc1", std::make_shared<Linear>(4, 3));
    fc2 = register_module("fc2", std::make_shared<Linear>(3, 2, /*bias=*/false));
  }
  Tensor forward(const Tensor& x) override { return (*fc2)((*fc1)(x).relu()) * parameter("scale"); }
  Tensor scale;
  std::shared_ptr<Linear> fc1, fc2;
};

template <typename T>
std::vector<std::string> Names(const std::vector<std::pair<std::string, T>>& named) {
  std::vector<std::string> out;
  for (const auto& [name, t] : named) out.push_back(name);
  return out;
}

std::string ErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(ModuleTest, ParametersAreListedOwnFirstThenChildrenInRegistrationOrder) {
  Net net;
  EXPECT_THAT(Names(net.named_parameters()),
              ElementsAre("scale", "fc1.weight", "fc1.bias", "fc2.weight"));
  EXPECT_THAT(Names(net.named_parameters(/*recurse=*/false)), ElementsAre("scale"));
  EXPECT_EQ(net.parameters().size(), 4u);
  EXPECT_THAT(Names(net.named_buffers()), ElementsAre("steps", "scratch"));
  for (const Tensor& p : net.parameters()) {
    EXPECT_TRUE(p.requires_grad());
    EXPECT_TRUE(p.is_leaf());
  }
  EXPECT_TRUE(net.fc1->weight().is_same(net.parameters()[1]));
}

TEST(ModuleTest, SequentialNamesChildrenByPosition) {
  Sequential seq(
      {std::make_shared<Linear>(2, 3), std::make_shared<ReLU>(), std::make_shared<Linear>(3, 1)});
  EXPECT_THAT(Names(seq.named_parameters()),
              ElementsAre("0.weight", "0.bias", "2.weight", "2.bias"));
  EXPECT_EQ(seq.size(), 3u);
  EXPECT_EQ(seq[-1]->name(), "Linear");
  EXPECT_THAT(ErrorOf([&] { seq[3]; }), HasSubstr("index 3 is out of range"));
  auto modules = seq.named_modules();
  ASSERT_EQ(modules.size(), 4u);
  EXPECT_EQ(modules[0].first, "");
  EXPECT_EQ(modules[3].first, "2");
}

TEST(ModuleTest, SharedParametersAreListedOnce) {
  auto shared = std::make_shared<Linear>(2, 2);
  Sequential seq({shared, shared});
  EXPECT_EQ(seq.parameters().size(), 2u);
}

TEST(ModuleTest, RegistrationRefusesBadAndDuplicateNames) {
  Net net;
  EXPECT_THAT(ErrorOf([&] { net.register_parameter("fc1", zeros({1})); }),
              HasSubstr("attribute \"fc1\" already exists as a child module"));
  EXPECT_THAT(ErrorOf([&] { net.register_buffer("a.b", zeros({1})); }),
              HasSubstr("can't contain \".\""));
  EXPECT_THAT(ErrorOf([&] { net.register_parameter("", zeros({1})); }),
              HasSubstr("name can't be empty"));
  EXPECT_THAT(ErrorOf([&] { net.register_parameter("i", zeros({1}, TensorOptions(kInt64))); }),
              HasSubstr("only floating point tensors can"));
  EXPECT_THAT(ErrorOf([&] { net.parameter("nope"); }), HasSubstr("Net has no parameter \"nope\""));
}

TEST(ModuleTest, TrainAndEvalReachEveryDescendant) {
  Net net;
  EXPECT_TRUE(net.fc2->is_training());
  net.eval();
  EXPECT_FALSE(net.is_training());
  EXPECT_FALSE(net.fc1->is_training());
  net.train();
  EXPECT_TRUE(net.fc2->is_training());
}

TEST(ModuleTest, ZeroGradSetsToNoneOrZeroes) {
  Net net;
  net(randn({5, 4})).sum().backward();
  for (const Tensor& p : net.parameters()) ASSERT_TRUE(p.grad().defined());
  net.zero_grad(/*set_to_none=*/false);
  for (const Tensor& p : net.parameters()) {
    ASSERT_TRUE(p.grad().defined());
    EXPECT_EQ(p.grad().abs().sum().item<double>(), 0.0);
  }
  net.zero_grad();
  for (const Tensor& p : net.parameters()) EXPECT_FALSE(p.grad().defined());
}

TEST(ModuleTest, ApplyVisitsChildrenBeforeParents) {
  auto inner =
      std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{std::make_shared<ReLU>()});
  Sequential outer({inner, std::make_shared<Linear>(1, 1)});
  std::vector<std::string> order;
  outer.apply([&](Module& m) { order.push_back(m.name()); });
  EXPECT_THAT(order, ElementsAre("ReLU", "Sequential", "Linear", "Sequential"));
}

TEST(ModuleTest, ToDtypeConvertsFloatingTensorsOnly) {
  Net net;
  Tensor before = net.fc1->weight().clone();
  net(randn({2, 4})).sum().backward();
  net.to(kFloat64);
  EXPECT_EQ(net.fc1->weight().dtype(), kFloat64);
  EXPECT_TRUE(net.fc1->weight().requires_grad());
  EXPECT_TRUE(net.fc1->weight().is_leaf());
  EXPECT_EQ(net.fc1->weight().grad().dtype(), kFloat64);
  EXPECT_EQ(net.buffer("steps").dtype(), kInt64);
  EXPECT_TRUE(net.fc1->weight().allclose(before.to(kFloat64)));
  // Forward still works in float64 and gradients flow to the new tensors.
  net.zero_grad();
  net(randn({2, 4}, kFloat64)).sum().backward();
  EXPECT_TRUE(net.fc1->weight().grad().defined());
  EXPECT_THAT(ErrorOf([&] { net.to(kInt64); }), HasSubstr("only floating point dtypes"));
}

TEST(ModuleTest, ToKeepsSharedParametersSharedAndFailsAtomically) {
  auto shared = std::make_shared<Linear>(2, 2);
  Sequential seq({shared, shared});
  seq.to(kFloat64);
  EXPECT_EQ(seq.parameters().size(), 2u);
  EXPECT_EQ(shared->weight().dtype(), kFloat64);
  Net net;
  Tensor before = net.fc1->weight();
  // No CUDA allocator in this build: nothing may change.
  EXPECT_THAT(ErrorOf([&] { net.to(Device(DeviceType::kCUDA, 0)); }), HasSubstr("cuda"));
  EXPECT_TRUE(net.fc1->weight().is_same(before));
}

TEST(ModuleTest, ShareMemoryMovesParametersAndBuffersInPlace) {
  namespace mp = multiprocessing;
  Net net;
  Tensor weight = net.fc1->weight();
  Tensor before = weight.clone();
  net(randn({2, 4})).sum().backward();  // a gradient, which stays private
  ASSERT_TRUE(net.share_memory().ok());
  for (const Tensor& t : net.parameters()) EXPECT_TRUE(mp::is_shared(t));
  for (const Tensor& t : net.buffers()) EXPECT_TRUE(mp::is_shared(t));
  EXPECT_FALSE(mp::is_shared(weight.grad()));
  // The same tensors, same values, still leaves that require grad.
  EXPECT_TRUE(net.fc1->weight().is_same(weight));
  EXPECT_TRUE(weight.equal(before));
  EXPECT_TRUE(weight.requires_grad());
  EXPECT_TRUE(weight.is_leaf());
  // A forked child's in-place SGD step is seen here; its gradient is its own.
  net.zero_grad();
  absl::StatusOr<mp::Process> child = mp::Process::start([&]() -> absl::Status {
    net(ones({1, 4})).sum().backward();
    autograd::NoGradGuard no_grad;
    for (const Tensor& p : net.parameters()) p.sub_(p.grad(), 0.5);
    net.buffer("steps").add_(1);
    return absl::OkStatus();
  });
  ASSERT_TRUE(child.ok());
  absl::StatusOr<mp::ExitStatus> e = child->join(absl::Seconds(20));
  ASSERT_TRUE(e.ok() && e->ok()) << child->error_message();
  EXPECT_FALSE(weight.equal(before));
  EXPECT_EQ(net.buffer("steps").item<int64_t>(), 1);
  EXPECT_FALSE(weight.grad().defined());
}

TEST(ModuleTest, StateDictHoldsParametersAndPersistentBuffers) {
  Net net;
  StateDict sd = net.state_dict();
  EXPECT_THAT(Names(sd), ElementsAre("scale", "steps", "fc1.weight", "fc1.bias", "fc2.weight"));
  EXPECT_FALSE(sd[0].second.requires_grad());
  // Shares storage with the module.
  EXPECT_EQ(sd[2].second.raw_data(), net.fc1->weight().raw_data());
}

TEST(ModuleTest, LoadStateDictCopiesValues) {
  manual_seed(1);
  Net a;
  Net b;
  ASSERT_FALSE(a.fc1->weight().equal(b.fc1->weight()));
  ASSERT_TRUE(b.load_state_dict(a.state_dict()).ok());
  EXPECT_TRUE(a.fc1->weight().equal(b.fc1->weight()));
  EXPECT_TRUE(a.fc2->weight().equal(b.fc2->weight()));
  // Still b's own storage, still a leaf that requires grad.
  EXPECT_NE(a.fc1->weight().raw_data(), b.fc1->weight().raw_data());
  EXPECT_TRUE(b.fc1->weight().requires_grad());
}

TEST(ModuleTest, LoadStateDictStrictNamesMissingAndUnexpectedKeys) {
  Net net;
  Tensor before = net.fc1->weight().clone();
  StateDict sd = net.state_dict();
  sd.erase(sd.begin() + 3);  // fc1.bias
  sd.emplace_back("fc3.weight", zeros({1}));
  for (auto& [k, v] : sd) {
    if (k == "fc1.weight") v = zeros({3, 4});
  }
  absl::Status s = net.load_state_dict(sd);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("Error(s) in loading state_dict for Net:\n\tMissing key(s) in state_dict: "
                        "\"fc1.bias\". \n\tUnexpected key(s) in state_dict: \"fc3.weight\". "));
  // Nothing was copied.
  EXPECT_TRUE(net.fc1->weight().equal(before));
  // Non-strict loads what matches.
  EXPECT_TRUE(net.load_state_dict(sd, /*strict=*/false).ok());
  EXPECT_EQ(net.fc1->weight().abs().sum().item<double>(), 0.0);
}

TEST(ModuleTest, LoadStateDictNamesShapeMismatchesEvenWhenNotStrict) {
  Net net;
  StateDict sd = net.state_dict();
  for (auto& [k, v] : sd) {
    if (k == "fc1.weight") v = zeros({2, 4});
  }
  absl::Status s = net.load_state_dict(sd, /*strict=*/false);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("size mismatch for fc1.weight: copying a param with shape [2, 4] from "
                        "checkpoint, the shape in current model is [3, 4]."));
}

TEST(ModuleTest, ForwardHooksReplaceInputAndOutputUntilRemoved) {
  Linear fc(2, 2);
  std::vector<std::string> calls;
  HookHandle pre = fc.register_forward_pre_hook([&](Module& m, const Tensor& x) {
    calls.push_back("pre " + m.name());
    return std::optional<Tensor>(x * 0.0);
  });
  HookHandle post = fc.register_forward_hook(
      [&](Module&, const Tensor& in, const Tensor& out) -> std::optional<Tensor> {
        calls.push_back("post");
        EXPECT_EQ(in.abs().sum().item<double>(), 0.0);  // saw the replaced input
        return out + 100.0;
      });
  Tensor y = fc(ones({1, 2}));
  EXPECT_THAT(calls, ElementsAre("pre Linear", "post"));
  // Zero input: output = bias + 100.
  EXPECT_TRUE(y.allclose(fc.bias().detach().unsqueeze(0) + 100.0));
  pre.remove();
  post.remove();
  post.remove();  // harmless
  Tensor z = fc(ones({1, 2}));
  EXPECT_EQ(calls.size(), 2u);
  EXPECT_TRUE(z.allclose(functional::linear(ones({1, 2}), fc.weight(), fc.bias())));
}

TEST(ModuleTest, FullBackwardHookSeesGradInputAndGradOutput) {
  Linear fc(3, 2);
  Tensor x = randn({4, 3}).requires_grad_();
  Tensor upstream = randn({4, 2});  // d(loss)/d(output), chosen by the test
  int calls = 0;
  Tensor seen_in, seen_out;
  fc.register_full_backward_hook(
      [&](Module& m, const Tensor& grad_input, const Tensor& grad_output) {
        ++calls;
        EXPECT_EQ(m.name(), "Linear");
        seen_in = grad_input.detach().clone();
        seen_out = grad_output.detach().clone();
        return std::optional<Tensor>();
      });
  (fc(x) * upstream).sum().backward();
  ASSERT_EQ(calls, 1);
  EXPECT_TRUE(seen_out.allclose(upstream));
  // y = x W^T + b, so d(loss)/dx = upstream W.
  EXPECT_TRUE(seen_in.allclose(upstream.matmul(fc.weight().detach())));
  EXPECT_TRUE(x.grad().allclose(seen_in));
}

TEST(ModuleTest, FullBackwardHookReplacesGradInputAndRunsPerCall) {
  Linear fc(3, 3);
  Tensor x = randn({2, 3}).requires_grad_();
  int calls = 0;
  HookHandle h = fc.register_full_backward_hook(
      [&](Module&, const Tensor& grad_input, const Tensor&) -> std::optional<Tensor> {
        ++calls;
        return grad_input * 3.0;
      });
  // The module used twice on one path: the hook runs once per call.
  Tensor y = fc(fc(x));
  y.sum().backward();
  EXPECT_EQ(calls, 2);
  // Plain gradient of sum(W(Wx+b)+b) w.r.t. x is (1^T W) W; each call's hook
  // tripled its grad_input, so x.grad is 9 times that.
  Tensor w = fc.weight().detach();
  Tensor plain = ones({2, 3}).matmul(w).matmul(w);
  EXPECT_TRUE(x.grad().allclose(plain * 9.0, 1e-4, 1e-5));
  h.remove();
  x.set_grad(Tensor());
  fc(x).sum().backward();
  EXPECT_EQ(calls, 2);
}

TEST(ModuleTest, FullBackwardHookWithoutInputGradGetsUndefinedGradInput) {
  Linear fc(3, 2);
  int calls = 0;
  bool input_defined = true;
  Tensor seen_out;
  fc.register_full_backward_hook([&](Module&, const Tensor& grad_input, const Tensor& grad_output) {
    ++calls;
    input_defined = grad_input.defined();
    seen_out = grad_output.detach().clone();
    return std::optional<Tensor>();
  });
  fc(randn({5, 3})).sum().backward();  // only the parameters need gradients
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(input_defined);
  EXPECT_TRUE(seen_out.allclose(ones({5, 2})));
  EXPECT_TRUE(fc.weight().grad().defined());
  {
    autograd::NoGradGuard no_grad;
    fc(randn({5, 3}).requires_grad_());
  }
  EXPECT_EQ(calls, 1);  // nothing recorded, nothing to hook
}

TEST(ModuleTest, FullBackwardHookOfAChildSeesItsOwnInput) {
  auto net = std::make_shared<Net>();
  Tensor x = randn({2, 4}).requires_grad_();
  Tensor fc2_input_grad;
  net->fc2->register_full_backward_hook(
      [&](Module&, const Tensor& grad_input, const Tensor&) {
        fc2_input_grad = grad_input.detach().clone();
        return std::optional<Tensor>();
      });
  (*net)(x).sum().backward();
  // fc2's input is relu(fc1(x)); d(sum(fc2(h) * scale))/dh = scale * 1^T W2.
  Tensor expected = ones({2, 2}).matmul(net->fc2->weight().detach()) *
                    net->parameter("scale").detach().item<double>();
  ASSERT_TRUE(fc2_input_grad.defined());
  EXPECT_TRUE(fc2_input_grad.allclose(expected));
}

TEST(ModuleTest, FullBackwardHookReturningAWrongShapeNamesBoth) {
  Linear fc(3, 2);
  fc.register_full_backward_hook([](Module&, const Tensor&, const Tensor&) {
    return std::optional<Tensor>(zeros({7}));
  });
  Tensor x = randn({4, 3}).requires_grad_();
  Tensor y = fc(x).sum();
  EXPECT_THAT(ErrorOf([&] { y.backward(); }),
              AllOf(HasSubstr("Linear"), HasSubstr("[7]"), HasSubstr("[4, 3]")));
}

TEST(ModuleTest, CloneIsDeepAndKeepsTypedChildrenConsistent) {
  auto net = std::make_shared<Net>();
  net->eval();
  net->fc1->train();
  (*net)(randn({3, 4})).sum().backward();
  auto copy = std::dynamic_pointer_cast<Net>(net->clone());
  ASSERT_NE(copy, nullptr);
  // Same values, different storage, typed pointers refer to the copy's children.
  EXPECT_TRUE(copy->fc1->weight().equal(net->fc1->weight()));
  EXPECT_NE(copy->fc1->weight().raw_data(), net->fc1->weight().raw_data());
  EXPECT_EQ(copy->fc1.get(), copy->child("fc1").get());
  EXPECT_NE(copy->fc1.get(), net->fc1.get());
  EXPECT_TRUE(copy->fc1->weight().requires_grad());
  ASSERT_TRUE(copy->fc1->weight().grad().defined());
  EXPECT_TRUE(copy->fc1->weight().grad().equal(net->fc1->weight().grad()));
  EXPECT_FALSE(copy->is_training());
  EXPECT_TRUE(copy->fc1->is_training());
  // Changing the copy leaves the original alone.
  {
    autograd::NoGradGuard no_grad;
    copy->fc1->weight().fill_(7);
  }
  EXPECT_FALSE(net->fc1->weight().equal(copy->fc1->weight()));
  // Parameters come in the same order in both.
  EXPECT_EQ(Names(copy->named_parameters()), Names(net->named_parameters()));
}

TEST(ModuleTest, CloneDoesNotDrawRandomNumbers) {
  manual_seed(3);
  auto net = std::make_shared<Net>();
  Tensor expected = randn({4});
  manual_seed(3);
  auto net2 = std::make_shared<Net>();
  auto copy = net2->clone();
  EXPECT_TRUE(randn({4}).equal(expected));
}

TEST(ModuleTest, CloneOfSequentialClonesChildrenAndHooks) {
  auto seq = std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{
      std::make_shared<Linear>(2, 2), std::make_shared<BatchNorm1d>(2)});
  int calls = 0;
  (*seq)[0]->register_forward_hook([&](Module&, const Tensor&, const Tensor&) {
    ++calls;
    return std::optional<Tensor>();
  });
  auto copy = std::static_pointer_cast<Sequential>(seq->clone());
  EXPECT_NE((*copy)[0].get(), (*seq)[0].get());
  EXPECT_TRUE(copy->state_dict()[0].second.equal(seq->state_dict()[0].second));
  (*copy)(randn({3, 2}));
  EXPECT_EQ(calls, 1);
  // The copy's BatchNorm updated its own running stats only.
  EXPECT_EQ(copy->buffers()[2].item<int64_t>(), 1);
  EXPECT_EQ(seq->buffers()[2].item<int64_t>(), 0);
}

// Tied weights: the decoder's weight is the encoder's (one tensor, two slots).
class TiedAutoencoder : public Cloneable<TiedAutoencoder> {
 public:
  TiedAutoencoder() { reset(); }
  void reset() override {
    enc = register_module("enc", std::make_shared<Linear>(3, 3, /*bias=*/false));
    register_parameter("dec_weight", enc->weight());
  }
  Tensor forward(const Tensor& x) override {
    return (*enc)(x).relu().matmul(parameter("dec_weight"));
  }
  std::shared_ptr<Linear> enc;
};

TEST(ModuleTest, CloneKeepsWhatTheOriginalShares) {
  // A module held twice by a container is cloned once and held twice.
  auto shared = std::make_shared<Linear>(2, 2);
  Sequential seq({shared, std::make_shared<ReLU>(), shared});
  auto copy = std::static_pointer_cast<Sequential>(seq.clone());
  EXPECT_EQ((*copy)[0].get(), (*copy)[2].get());
  EXPECT_NE((*copy)[0].get(), shared.get());
  EXPECT_EQ(copy->parameters().size(), seq.parameters().size());

  // Tied weights are one tensor with one gradient (torch registers the same
  // Parameter object in both slots)...
  TiedAutoencoder net;
  EXPECT_EQ(net.parameters().size(), 1u);
  net(randn({2, 3})).sum().backward();
  ASSERT_TRUE(net.enc->weight().grad().defined());
  EXPECT_TRUE(net.parameter("dec_weight").grad().is_same(net.enc->weight().grad()));
  // ... and stay tied in a clone: a step through one slot moves both.
  auto tied = std::static_pointer_cast<TiedAutoencoder>(net.clone());
  ASSERT_TRUE(tied->parameter("dec_weight").is_same(tied->enc->weight()));
  EXPECT_FALSE(tied->enc->weight().is_same(net.enc->weight()));
  EXPECT_TRUE(tied->enc->weight().equal(net.enc->weight()));
  {
    autograd::NoGradGuard no_grad;
    tied->parameter("dec_weight").add_(1.0);
  }
  EXPECT_TRUE(tied->enc->weight().equal(tied->parameter("dec_weight")));
  EXPECT_FALSE(tied->enc->weight().equal(net.enc->weight()));

  // Separate clones share nothing with each other.
  auto again = std::static_pointer_cast<Sequential>(seq.clone());
  EXPECT_NE((*again)[0].get(), (*copy)[0].get());
}

TEST(ModuleTest, ReplicaForDataParallelHoldsTheGivenTensorsAndPassesGradientsBack) {
  auto net = std::make_shared<Net>();
  auto shared = std::make_shared<Linear>(4, 4);  // fills both of its slots in the replica
  auto seq =
      std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{shared, shared, net});
  std::vector<Tensor> params = seq->parameters(), buffers = seq->buffers();
  std::vector<Tensor> copies, buffer_copies;
  for (const Tensor& p : params) copies.push_back(p * 2);  // non-leaf, recorded
  for (const Tensor& b : buffers) buffer_copies.push_back(b.clone());
  auto replica =
      std::static_pointer_cast<Sequential>(seq->replicate_for_data_parallel(copies, buffer_copies));
  EXPECT_TRUE((*replica)[0]->parameter("weight").is_same(copies[0]));
  EXPECT_TRUE((*replica)[1]->parameter("weight").is_same(copies[0]));
  auto net_replica = std::static_pointer_cast<Net>((*replica)[2]);
  EXPECT_TRUE(net_replica->fc1->weight().is_same(copies[3]));
  EXPECT_EQ(net_replica->fc1.get(), net_replica->child("fc1").get());
  EXPECT_TRUE(net_replica->buffer("scratch").is_same(buffer_copies[1]));
  EXPECT_FALSE(net_replica->fc1->weight().is_leaf());
  // The original is untouched, and backward through the replica reaches it.
  EXPECT_TRUE(net->fc1->weight().is_leaf());
  Tensor x = randn({5, 4});
  (*replica)(x).sum().backward();
  // The same computation on leaves holding 2p (clone() would unshare `shared`).
  auto shared2 = shared->clone();
  auto plain = std::make_shared<Sequential>(
      std::vector<std::shared_ptr<Module>>{shared2, shared2, net->clone()});
  {
    autograd::NoGradGuard no_grad;
    for (const Tensor& p : plain->parameters()) p.mul_(2);
  }
  plain->zero_grad();  // clone() copied the gradients just computed
  (*plain)(x).sum().backward();
  for (size_t i = 0; i < params.size(); ++i) {
    ASSERT_TRUE(params[i].grad().defined()) << i;
    // d/dp of f(2p) = 2 f'(2p)
    EXPECT_TRUE(params[i].grad().allclose(plain->parameters()[i].grad() * 2, 1e-5, 1e-6)) << i;
  }
  EXPECT_THAT(ErrorOf([&] { seq->replicate_for_data_parallel(copies, {}); }),
              HasSubstr("got 6 parameters and 0 buffers for a module with 6 parameters and 2 "
                        "buffers"));
}

// The residual block of nn/README.md.
class Block : public Cloneable<Block> {
 public:
  explicit Block(int64_t c) : c_(c) { reset(); }
  void reset() override {
    conv = register_module("conv", std::make_shared<Conv2d>(Conv2dOptions{.in_channels = c_,
                                                                          .out_channels = c_,
                                                                          .kernel_size = {3, 3},
                                                                          .padding = {1, 1},
                                                                          .bias = false}));
    bn = register_module("bn", std::make_shared<BatchNorm2d>(c_));
  }
  Tensor forward(const Tensor& x) override { return functional::relu((*bn)((*conv)(x)) + x); }
  std::shared_ptr<Conv2d> conv;
  std::shared_ptr<BatchNorm2d> bn;

 private:
  int64_t c_;
};

TEST(ModuleTest, ResidualBlockTrainsAndClones) {
  manual_seed(4);
  auto block = std::make_shared<Block>(2);
  EXPECT_THAT(Names(block->named_parameters()), ElementsAre("conv.weight", "bn.weight", "bn.bias"));
  EXPECT_THAT(Names(block->state_dict()),
              ElementsAre("conv.weight", "bn.weight", "bn.bias", "bn.running_mean",
                          "bn.running_var", "bn.num_batches_tracked"));
  Tensor x = randn({2, 2, 4, 4});
  (*block)(x).sum().backward();
  auto replica = std::static_pointer_cast<Block>(block->clone());
  EXPECT_EQ(replica->conv.get(), replica->child("conv").get());
  EXPECT_TRUE(replica->bn->running_mean().equal(block->bn->running_mean()));
  block->eval();
  replica->eval();
  EXPECT_TRUE((*replica)(x).equal((*block)(x)));
  EXPECT_TRUE(replica->conv->weight().grad().equal(block->conv->weight().grad()));
}

TEST(ModuleTest, ModulesThatAreNotCloneableSaySo) {
  struct Plain : Module {
    Tensor forward(const Tensor& x) override { return x; }
  };
  Plain p;
  EXPECT_THAT(ErrorOf([&] { p.clone(); }), HasSubstr("derive it from ember::nn::Cloneable"));
}

// A model that reads its children through the registry, so it allows
// replace_module (Note [Replacing a child]).
class Classifier : public Cloneable<Classifier> {
 public:
  Classifier() { reset(); }
  void reset() override {
    register_module("body", std::make_shared<Linear>(4, 3));
    register_module("head", std::make_shared<Linear>(3, 2));
    register_module("norm", std::make_shared<BatchNorm1d>(2));
  }
  Tensor forward(const Tensor& x) override {
    return (*child("norm"))((*child("head"))((*child("body"))(x).relu()));
  }

 protected:
  bool children_replaceable() const override { return true; }
};

// The replacement head used below: Linear(3, 5) -> ReLU -> Linear(5, 2).
std::shared_ptr<Sequential> DeeperHead() {
  return std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{
      std::make_shared<Linear>(3, 5), std::make_shared<ReLU>(), std::make_shared<Linear>(5, 2)});
}

TEST(ModuleTest, ReplaceModuleTakesTheOldChildsPlace) {
  auto model = std::make_shared<Classifier>();
  std::shared_ptr<Module> old_head = model->child("head");
  std::shared_ptr<Sequential> head = model->replace_module("head", DeeperHead());
  EXPECT_EQ(model->child("head").get(), head.get());
  EXPECT_THAT(Names(model->named_children()), ElementsAre("body", "head", "norm"));
  EXPECT_THAT(Names(model->state_dict()),
              ElementsAre("body.weight", "body.bias", "head.0.weight", "head.0.bias",
                          "head.2.weight", "head.2.bias", "norm.weight", "norm.bias",
                          "norm.running_mean", "norm.running_var", "norm.num_batches_tracked"));
  // parameters() lists the new head's tensors where the old head's were.
  std::vector<Tensor> params = model->parameters();
  ASSERT_EQ(params.size(), 8u);
  const auto first = std::static_pointer_cast<Linear>((*head)[0]);
  const auto last = std::static_pointer_cast<Linear>((*head)[2]);
  EXPECT_TRUE(params[2].is_same(first->weight()));
  EXPECT_TRUE(params[3].is_same(first->bias()));
  EXPECT_TRUE(params[4].is_same(last->weight()));
  EXPECT_TRUE(params[5].is_same(last->bias()));
  for (const Tensor& p : params) {
    EXPECT_FALSE(p.is_same(std::static_pointer_cast<Linear>(old_head)->weight()));
  }
  // forward() calls the new head: the output is what the pieces compute.
  model->eval();
  Tensor x = randn({6, 4});
  Tensor expected = (*model->child("norm"))((*head)((*model->child("body"))(x).relu()));
  EXPECT_TRUE((*model)(x).equal(expected));
  // A state_dict saved after the replacement loads into another replaced model.
  auto other = std::make_shared<Classifier>();
  other->replace_module("head", DeeperHead());
  ASSERT_TRUE(other->load_state_dict(model->state_dict()).ok());
  other->eval();
  EXPECT_TRUE((*other)(x).equal((*model)(x)));
  // ...and not into one with the original head: its keys differ.
  absl::Status status = std::make_shared<Classifier>()->load_state_dict(model->state_dict());
  EXPECT_THAT(std::string(status.message()), HasSubstr("Unexpected key(s) in state_dict: "
                                                       "\"head.0.weight\""));
}

TEST(ModuleTest, ReplaceModuleNamesWhatIsWrong) {
  auto model = std::make_shared<Classifier>();
  EXPECT_THAT(ErrorOf([&] { model->replace_module("haed", std::make_shared<Linear>(3, 2)); }),
              HasSubstr("Classifier.replace_module: there is no child module \"haed\" to "
                        "replace; its children are \"body\", \"head\", \"norm\""));
  EXPECT_THAT(ErrorOf([&] { model->replace_module("head", std::shared_ptr<Linear>()); }),
              HasSubstr("the new child \"head\" is null"));
  Linear leaf(2, 2);
  EXPECT_THAT(ErrorOf([&] { leaf.replace_module("fc", std::make_shared<Linear>(3, 2)); }),
              HasSubstr("there is no child module \"fc\" to replace; it has no child modules"));
  // Modules with typed pointers to their children refuse, and stay as they were.
  auto net = std::make_shared<Net>();
  EXPECT_THAT(ErrorOf([&] { net->replace_module("fc1", std::make_shared<Linear>(4, 3)); }),
              HasSubstr("Net does not allow replacing its children"));
  EXPECT_EQ(net->child("fc1").get(), net->fc1.get());
  auto seq = DeeperHead();
  std::shared_ptr<Module> first = (*seq)[0];
  EXPECT_THAT(ErrorOf([&] { seq->replace_module("0", std::make_shared<Linear>(3, 5)); }),
              HasSubstr("Sequential does not allow replacing its children"));
  EXPECT_EQ(seq->child("0").get(), first.get());
}

TEST(ModuleTest, CloneOfAModuleWithAReplacedChildClonesTheReplacement) {
  manual_seed(5);
  auto model = std::make_shared<Classifier>();
  auto head = model->replace_module("head", DeeperHead());
  int calls = 0;
  head->register_forward_hook([&](Module&, const Tensor&, const Tensor&) {
    ++calls;
    return std::optional<Tensor>();
  });
  Tensor x = randn({6, 4});
  (*model)(x).sum().backward();
  auto copy = std::static_pointer_cast<Classifier>(model->clone());
  // The copy has the replacement's structure, its own storage and the values.
  EXPECT_EQ(Names(copy->state_dict()), Names(model->state_dict()));
  auto copied_head = std::dynamic_pointer_cast<Sequential>(copy->child("head"));
  ASSERT_NE(copied_head, nullptr);
  EXPECT_NE(copied_head.get(), head.get());
  std::vector<Tensor> original = model->parameters(), copied = copy->parameters();
  ASSERT_EQ(copied.size(), original.size());
  for (size_t i = 0; i < copied.size(); ++i) {
    EXPECT_TRUE(copied[i].equal(original[i])) << i;
    EXPECT_NE(copied[i].raw_data(), original[i].raw_data()) << i;
    ASSERT_TRUE(copied[i].grad().defined()) << i;
    EXPECT_TRUE(copied[i].grad().equal(original[i].grad())) << i;
  }
  // Same outputs, the hook came along, and a clone of the clone works too.
  model->eval();
  copy->eval();
  calls = 0;
  EXPECT_TRUE((*copy)(x).equal((*model)(x)));
  EXPECT_EQ(calls, 2);
  auto again = copy->clone();
  again->eval();
  EXPECT_TRUE((*again)(x).equal((*model)(x)));
  // The clone's head can be replaced again without touching the original.
  copy->replace_module("head", std::make_shared<Linear>(3, 2));
  EXPECT_EQ(model->child("head").get(), head.get());
}

TEST(ModuleTest, PrintsTheTree) {
  Net net;
  EXPECT_EQ(net.str(),
            "Net(\n"
            "  (fc1): Linear(in_features=4, out_features=3, bias=True)\n"
            "  (fc2): Linear(in_features=3, out_features=2, bias=False)\n"
            ")");
}

}  // namespace
}  // namespace ember::nn
