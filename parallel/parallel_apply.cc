#include "parallel/parallel_apply.h"

#include <cxxabi.h>

#include <cstdlib>
#include <exception>
#include <optional>
#include <string>
#include <thread>
#include <typeinfo>

#include "autograd/grad_mode.h"
#include "tensor/device_guard.h"
#include "tensor/error.h"
#include "tensor/stream.h"

namespace ember::parallel {
namespace {

// The first tensor in `v`, depth-first (torch's get_a_var).
const Tensor* FirstTensor(const Value& v) {
  if (const Tensor* t = v.get_if<Tensor>()) return t;
  for (const Value& e : v.list()) {
    if (const Tensor* t = FirstTensor(e)) return t;
  }
  for (const auto& [key, e] : v.dict()) {
    if (const Tensor* t = FirstTensor(e)) return t;
  }
  return nullptr;
}

// The name of the exception being handled ("ember::Error").
std::string CurrentExceptionName() {
  const std::type_info* type = abi::__cxa_current_exception_type();
  if (type == nullptr) return "an unknown exception";
  int status = 0;
  char* demangled = abi::__cxa_demangle(type->name(), nullptr, nullptr, &status);
  std::string name = status == 0 && demangled != nullptr ? demangled : type->name();
  std::free(demangled);
  return name;
}

}  // namespace

Value call_module(nn::Module& module, const Value::List& args, const Value::Dict& kwargs) {
  EMBER_CHECK(kwargs.empty(), module.name(), " takes no keyword arguments, got ", kwargs.size(),
              " (first: '", kwargs.begin()->first,
              "'); pass a ReplicaForward to call modules with keyword arguments");
  EMBER_CHECK(
      args.size() == 1 && args[0].is<Tensor>(), module.name(), " takes one tensor argument, got ",
      args.size(), " arguments",
      args.empty() ? std::string() : std::string(" (first: a ") + std::string(args[0].kind()) + ")",
      "; pass a ReplicaForward to call modules with other arguments");
  return Value(module(*args[0].get_if<Tensor>()));
}

std::vector<Value> parallel_apply(absl::Span<const std::shared_ptr<nn::Module>> modules,
                                  absl::Span<const Value> inputs,
                                  absl::Span<const Value::Dict> kwargs,
                                  absl::Span<const Device> devices, const ReplicaForward& forward) {
  const size_t n = modules.size();
  EMBER_CHECK(inputs.size() == n, "parallel_apply: the number of modules ", n,
              " is not equal to the number of inputs ", inputs.size());
  EMBER_CHECK(kwargs.empty() || kwargs.size() == n, "parallel_apply: the number of modules ", n,
              " is not equal to the number of kwargs ", kwargs.size());
  EMBER_CHECK(devices.empty() || devices.size() == n, "parallel_apply: the number of modules ", n,
              " is not equal to the number of devices ", devices.size());
  const bool grad_enabled = autograd::GradMode::is_enabled();
  std::vector<Value> results(n);
  std::vector<std::optional<std::string>> errors(n);

  // Each replica's device, and the caller's current stream there, which the
  // replica's thread makes its own (torch's parallel_apply: streams are per
  // thread, and a replica must queue behind what the caller queued).
  std::vector<std::optional<Device>> resolved(n);
  std::vector<std::optional<Stream>> streams(n);
  for (size_t i = 0; i < n; ++i) {
    if (!devices.empty()) {
      resolved[i] = devices[i];
    } else if (const Tensor* t = FirstTensor(inputs[i])) {
      resolved[i] = t->device();
    }
    if (resolved[i].has_value() && !resolved[i]->is_cpu()) {
      streams[i] = current_stream(*resolved[i]);
    }
  }

  auto worker = [&](size_t i) {
    autograd::AutoGradMode grad_mode(grad_enabled);
    const std::optional<Device>& device = resolved[i];
    if (!device) {
      errors[i] = "in replica " + std::to_string(i) +
                  ", no device was provided and no tensor input was found; device cannot be "
                  "resolved";
      return;
    }
    try {
      DeviceGuard guard(*device);
      std::optional<StreamGuard> stream_guard;
      if (streams[i].has_value()) stream_guard.emplace(*streams[i]);
      static const Value::Dict kNoKwargs;
      Value::List args = inputs[i].is<Value::List>() ? inputs[i].list() : Value::List{inputs[i]};
      results[i] = forward(*modules[i], args, kwargs.empty() ? kNoKwargs : kwargs[i]);
    } catch (const std::exception& e) {
      errors[i] = "Caught " + CurrentExceptionName() + " in replica " + std::to_string(i) +
                  " on device " + device->str() + ".\nOriginal message: " + e.what();
    } catch (...) {
      errors[i] = "Caught " + CurrentExceptionName() + " in replica " + std::to_string(i) +
                  " on device " + device->str() + ".";
    }
  };

  if (n == 1) {
    worker(0);
  } else {
    std::vector<std::thread> threads;
    threads.reserve(n);
    for (size_t i = 0; i < n; ++i) threads.emplace_back(worker, i);
    for (std::thread& t : threads) t.join();
  }
  for (size_t i = 0; i < n; ++i) {
    if (errors[i]) EMBER_FAIL(*errors[i]);
  }
  return results;
}

}  // namespace ember::parallel
