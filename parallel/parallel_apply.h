// parallel_apply: runs each replica on its share of the inputs, one thread
// per replica, as torch.nn.parallel.parallel_apply.
//
//   ```cpp
//   #include "nn/activation.h"
//   #include "nn/container.h"
//   #include "nn/linear.h"
//   #include "parallel/parallel_apply.h"
//   #include "parallel/replicate.h"
//   #include "parallel/scatter_gather.h"
//   #include "tensor/factories.h"
//   auto model = std::make_shared<ember::nn::Sequential>();
//   model->push_back(std::make_shared<ember::nn::Linear>(8, 16));
//   model->push_back(std::make_shared<ember::nn::ReLU>());
//   model->push_back(std::make_shared<ember::nn::Linear>(16, 4));
//   ember::Tensor x = ember::randn({10, 8});
//   using ember::parallel::Value;
//   std::vector<ember::Device> devices(2, ember::kCPU);
//   auto replicas = ember::parallel::replicate(model, devices);
//   std::vector<Value> shares = ember::parallel::scatter(Value(x), devices);
//   std::vector<Value> outputs = ember::parallel::parallel_apply(replicas, shares, {}, devices);
//   ember::Tensor y = ember::parallel::gather(outputs, ember::kCPU).as<ember::Tensor>().value();
//   if (y.size(0) != 10) return absl::InternalError("rows lost");
//   ```
//
// Replica i runs on a thread of its own (on the calling thread when there is
// one replica) under a DeviceGuard for devices[i] (tensor/device_guard.h: a
// no-op on the CPU), with the caller's current stream of that device made
// current on the replica's thread (streams are per thread; a replica's
// kernels queue behind what the caller queued there, as in torch) and with
// the caller's grad mode. Its input is a list of positional arguments (any other value is
// one argument) and a dict of keyword arguments; `forward` calls the module
// with them. The default calls module(tensor) and so takes exactly one tensor
// argument and no keyword arguments; pass a ReplicaForward for modules with
// another calling convention.
//
// Errors: a replica that throws makes parallel_apply throw ember::Error, once
// every thread has finished, for the lowest such replica: "Caught
// ember::Error in replica 1 on device cpu.\nOriginal message: <what it
// threw>", as PyTorch re-raises a replica's exception. A mismatch between the
// counts of modules, inputs, kwargs and devices throws before any thread starts.
// Thread-safety: the replicas must be distinct modules (replicate() makes
// them).
#ifndef EMBER_PARALLEL_PARALLEL_APPLY_H_
#define EMBER_PARALLEL_PARALLEL_APPLY_H_

#include <functional>
#include <memory>
#include <vector>

#include "absl/types/span.h"
#include "multiprocessing/value.h"
#include "nn/module.h"
#include "tensor/device.h"

namespace ember::parallel {

using Value = multiprocessing::Value;

// How one replica is called on its positional and keyword arguments.
using ReplicaForward =
    std::function<Value(nn::Module& module, const Value::List& args, const Value::Dict& kwargs)>;

// The default ReplicaForward: module(args[0]) for a single tensor argument
// and no keyword arguments; throws ember::Error naming what it got otherwise.
Value call_module(nn::Module& module, const Value::List& args, const Value::Dict& kwargs);

// outputs[i] = forward(*modules[i], inputs[i], kwargs[i]) on devices[i].
// `kwargs` empty: none for every replica. `devices` empty: each replica's
// device is that of the first tensor in its inputs (an error when it has
// none).
std::vector<Value> parallel_apply(absl::Span<const std::shared_ptr<nn::Module>> modules,
                                  absl::Span<const Value> inputs,
                                  absl::Span<const Value::Dict> kwargs = {},
                                  absl::Span<const Device> devices = {},
                                  const ReplicaForward& forward = call_module);

}  // namespace ember::parallel

#endif  // EMBER_PARALLEL_PARALLEL_APPLY_H_
