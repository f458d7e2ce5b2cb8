// DataParallel: single-process data parallelism, as torch.nn.DataParallel.
// Each forward splits the batch across the devices, runs a replica of the
// module on each share in a thread of its own and concatenates the outputs on
// the output device; backward sums every replica's gradients into the
// wrapped module's parameters.
//
//   ```cpp
//   #include "nn/activation.h"
//   #include "nn/container.h"
//   #include "nn/linear.h"
//   #include "nn/loss.h"
//   #include "parallel/data_parallel.h"
//   #include "tensor/factories.h"
//   auto model = std::make_shared<ember::nn::Sequential>();
//   model->push_back(std::make_shared<ember::nn::Linear>(8, 16));
//   model->push_back(std::make_shared<ember::nn::ReLU>());
//   model->push_back(std::make_shared<ember::nn::Linear>(16, 4));
//   ember::Tensor x = ember::randn({12, 8}), y = ember::randn({12, 4});
//   // Three CPU replicas (Note [Device lists] in parallel/README.md), 4 rows each.
//   std::vector<ember::Device> devices(3, ember::kCPU);
//   auto dp = std::make_shared<ember::parallel::DataParallel>(
//       model, ember::parallel::DataParallelOptions{.device_ids = devices});
//   ember::nn::functional::mse_loss((*dp)(x), y).backward();   // model's grads: whole batch
//
//   // The functional form, here with a module call that takes two arguments.
//   using ember::parallel::Value;
//   ember::parallel::ReplicaForward scaled = [](ember::nn::Module& m, const Value::List& args,
//                                               const Value::Dict&) -> Value {
//     return m(args[0].as<ember::Tensor>().value()) * args[1].as<double>().value();
//   };
//   Value out = ember::parallel::data_parallel(model, Value(Value::List{Value(x), Value(0.5)}),
//                                              devices, std::nullopt, 0, {}, scaled);
//   if (out.as<ember::Tensor>()->size(0) != 12) return absl::InternalError("rows lost");
//   ```
//
// The building blocks are usable alone: scatter_gather.h, replicate.h,
// parallel_apply.h, functions.h and comm.h.
//
// Forward, step by step as PyTorch's:
//   - no device ids (left unset on a build without an accelerator, as
//     PyTorch without CUDA): the module runs as is;
//   - every parameter and buffer must be on device_ids[0], or forward
//     throws PyTorch's "module must have its parameters and buffers on
//     device cpu (device_ids[0]) but found one of them on device: ...";
//   - the inputs are scattered along `dim` (scatter_kwargs); with one device
//     the module is called directly on its share;
//   - otherwise the module is replicated onto as many devices as there are
//     shares (replicate(); detached when grad mode is off), buffers come from
//     device_ids[0] (the first replica shares them, so BatchNorm's running
//     statistics in the module follow the first share), the replicas run in
//     parallel_apply (the module's forward hooks run once per replica), and
//     the outputs are gathered on output_device.
//
// Errors: forward is tensor math and throws ember::Error (a replica's error
// names its replica and device). The constructor throws ember::Error for a
// null module, an explicitly empty device list or one that mixes device
// types, as PyTorch's constructor raises. Thread-compatible: one forward at
// a time.
#ifndef EMBER_PARALLEL_DATA_PARALLEL_H_
#define EMBER_PARALLEL_DATA_PARALLEL_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "multiprocessing/value.h"
#include "nn/module.h"
#include "parallel/parallel_apply.h"
#include "tensor/device.h"
#include "tensor/device_guard.h"

namespace ember::parallel {

struct DataParallelOptions {
  // One entry per replica. Unset: every device of the accelerator type
  // (device_count(kCUDA) of them): none without CUDA, so the module runs as
  // is. For CPU replicas list kCPU once per replica.
  std::optional<std::vector<Device>> device_ids;
  // Where outputs are gathered; unset: device_ids[0]. PyTorch's -1 is kCPU.
  std::optional<Device> output_device;
  // The dim inputs are split along and outputs joined along.
  int64_t dim = 0;
  // How a replica is called (parallel_apply.h); the default takes one tensor.
  ReplicaForward forward = call_module;
};

class DataParallel : public nn::Module {
 public:
  explicit DataParallel(std::shared_ptr<nn::Module> module, DataParallelOptions options = {});

  // The module's output for `input`, computed on the replicas; see above.
  Tensor forward(const Tensor& input) override;
  // The same for any arguments (what the options' `forward` accepts).
  Value forward(const Value::List& inputs, const Value::Dict& kwargs);

  std::string name() const override { return "DataParallel"; }
  const std::shared_ptr<nn::Module>& module() const { return module_; }
  const std::vector<Device>& device_ids() const { return device_ids_; }
  Device output_device() const { return output_device_; }
  int64_t dim() const { return options_.dim; }

 private:
  std::shared_ptr<nn::Module> module_;
  DataParallelOptions options_;
  std::vector<Device> device_ids_;
  Device output_device_;
};

// torch.nn.parallel.data_parallel: DataParallel's forward without the
// module object. `inputs` is the list of positional arguments (any other
// value is the one argument). Throws ember::Error when device_ids is unset
// and there is no accelerator ("no available devices were found"), for an
// empty or mixed device list, and as DataParallel::forward.
Value data_parallel(const std::shared_ptr<nn::Module>& module, const Value& inputs,
                    std::optional<std::vector<Device>> device_ids = std::nullopt,
                    std::optional<Device> output_device = std::nullopt, int64_t dim = 0,
                    const Value::Dict& module_kwargs = {},
                    const ReplicaForward& forward = call_module);

// PyTorch's imbalance rule: when one device has less than 75% of the total
// memory of another, or else less than 75% of its multiprocessor count, the
// warning DataParallel prints naming both (the first smallest and the first
// largest); nullopt when balanced. `properties[i]` describes device_ids[i].
// DataParallel's constructor applies it to get_device_properties() of its
// devices when their backend reports them (the CPU reports none).
std::optional<std::string> check_balance(absl::Span<const Device> device_ids,
                                         absl::Span<const DeviceProperties> properties);

}  // namespace ember::parallel

#endif  // EMBER_PARALLEL_DATA_PARALLEL_H_
