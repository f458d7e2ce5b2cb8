#include "parallel/scatter_gather.h"

#include <algorithm>
#include <string>

#include "parallel/functions.h"
#include "tensor/error.h"

namespace ember::parallel {
namespace {

std::vector<Value> ScatterMap(const Value& obj, absl::Span<const Device> devices, int64_t dim) {
  if (const Tensor* t = obj.get_if<Tensor>()) {
    std::vector<Tensor> pieces = Scatter::apply(devices, {}, dim, *t);
    return std::vector<Value>(pieces.begin(), pieces.end());
  }
  if (!obj.list().empty()) {
    // zip(*map(scatter_map, obj)): as many shares as the shortest split.
    std::vector<std::vector<Value>> columns;
    size_t n = devices.size();
    for (const Value& v : obj.list()) {
      columns.push_back(ScatterMap(v, devices, dim));
      n = std::min(n, columns.back().size());
    }
    std::vector<Value> out;
    for (size_t r = 0; r < n; ++r) {
      Value::List share;
      for (auto& column : columns) share.push_back(column[r]);
      out.emplace_back(std::move(share));
    }
    return out;
  }
  if (!obj.dict().empty()) {
    std::vector<std::pair<const std::string*, std::vector<Value>>> columns;
    size_t n = devices.size();
    for (const auto& [key, v] : obj.dict()) {
      columns.emplace_back(&key, ScatterMap(v, devices, dim));
      n = std::min(n, columns.back().second.size());
    }
    std::vector<Value> out;
    for (size_t r = 0; r < n; ++r) {
      Value::Dict share;
      for (auto& [key, column] : columns) share.emplace(*key, column[r]);
      out.emplace_back(std::move(share));
    }
    return out;
  }
  return std::vector<Value>(devices.size(), obj);
}

Value GatherMap(absl::Span<const Value> outputs, Device target, int64_t dim) {
  const Value& first = outputs[0];
  if (first.is<Tensor>()) {
    std::vector<Tensor> tensors;
    for (size_t r = 0; r < outputs.size(); ++r) {
      const Tensor* t = outputs[r].get_if<Tensor>();
      EMBER_CHECK(t != nullptr, "gather: replica 0 returned a tensor but replica ", r,
                  " returned a ", outputs[r].kind());
      tensors.push_back(*t);
    }
    return Value(Gather::apply(target, dim, tensors));
  }
  if (first.is_none()) return Value();
  if (first.is<Value::Dict>()) {
    for (size_t r = 0; r < outputs.size(); ++r) {
      EMBER_CHECK(outputs[r].is<Value::Dict>() && outputs[r].dict().size() == first.dict().size(),
                  "All dicts must have the same number of keys (replica 0 returned ",
                  first.dict().size(), " keys, replica ", r, " returned a ", outputs[r].kind(),
                  " with ", outputs[r].dict().size(), ")");
    }
    Value::Dict out;
    for (const auto& [key, unused] : first.dict()) {
      std::vector<Value> column;
      for (size_t r = 0; r < outputs.size(); ++r) {
        const Value* v = outputs[r].find(key);
        EMBER_CHECK(v != nullptr, "gather: replica ", r, " has no key '", key,
                    "', which replica 0 returned");
        column.push_back(*v);
      }
      out.emplace(key, GatherMap(column, target, dim));
    }
    return Value(std::move(out));
  }
  if (first.is<Value::List>()) {
    size_t n = first.list().size();
    for (const Value& v : outputs) n = std::min(n, v.list().size());  // zip(*outputs)
    Value::List out;
    for (size_t i = 0; i < n; ++i) {
      std::vector<Value> column;
      for (const Value& v : outputs) column.push_back(v.list()[i]);
      out.push_back(GatherMap(column, target, dim));
    }
    return Value(std::move(out));
  }
  EMBER_FAIL("gather: can't gather replica outputs of kind ", first.kind(),
             "; a replica must return tensors, or lists or dicts of them");
}

}  // namespace

std::vector<Value> scatter(const Value& inputs, absl::Span<const Device> devices, int64_t dim) {
  EMBER_CHECK(!devices.empty(), "scatter: expected at least one device");
  return ScatterMap(inputs, devices, dim);
}

std::pair<std::vector<Value::List>, std::vector<Value::Dict>> scatter_kwargs(
    const Value::List& inputs, const Value::Dict& kwargs, absl::Span<const Device> devices,
    int64_t dim) {
  std::vector<Value::List> scattered_inputs;
  std::vector<Value::Dict> scattered_kwargs;
  if (!inputs.empty()) {
    for (Value& v : scatter(Value(inputs), devices, dim)) scattered_inputs.push_back(v.list());
  }
  if (!kwargs.empty()) {
    for (Value& v : scatter(Value(kwargs), devices, dim)) scattered_kwargs.push_back(v.dict());
  }
  scattered_inputs.resize(std::max(scattered_inputs.size(), scattered_kwargs.size()));
  scattered_kwargs.resize(scattered_inputs.size());
  return {std::move(scattered_inputs), std::move(scattered_kwargs)};
}

Value gather(absl::Span<const Value> outputs, Device target_device, int64_t dim) {
  EMBER_CHECK(!outputs.empty(), "gather: expected the output of at least one replica");
  return GatherMap(outputs, target_device, dim);
}

}  // namespace ember::parallel
