#include "data/collate.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "multiprocessing/sharing.h"
#include "tensor/factories.h"
#include "tensor/shape.h"
#include "tensor/status_macros.h"

namespace ember::data {
namespace {

absl::Status Mismatch(const std::string& where, const std::string& what) {
  return absl::InvalidArgumentError(
      absl::StrCat("default_collate: ", what, " (at ", where.empty() ? "the sample" : where, ")"));
}

absl::StatusOr<Sample> StackTensors(const std::vector<Sample>& samples, const std::string& where) {
  const Tensor& first = *samples[0].get_if<Tensor>();
  for (size_t i = 1; i < samples.size(); ++i) {
    const Tensor& t = *samples[i].get_if<Tensor>();
    if (t.sizes() != first.sizes() || t.dtype() != first.dtype() || t.device() != first.device()) {
      return Mismatch(
          where,
          absl::StrCat("stack expects each tensor to be equal size, dtype and device, but got ",
                       ShapeToString(first.sizes()), " ", std::string(dtype_name(first.dtype())),
                       " on ", first.device().str(), " at entry 0 and ", ShapeToString(t.sizes()),
                       " ", std::string(dtype_name(t.dtype())), " on ", t.device().str(),
                       " at entry ", i));
    }
  }
  SizeVector sizes{static_cast<int64_t>(samples.size())};
  sizes.insert(sizes.end(), first.sizes().begin(), first.sizes().end());
  Tensor out;
  if (get_worker_info() != nullptr && first.is_cpu()) {
    EMBER_ASSIGN_OR_RETURN(out, multiprocessing::empty_shared(sizes, first.dtype()));
  } else {
    out = empty(sizes, TensorOptions(first.dtype()).device(first.device()));
  }
  for (size_t i = 0; i < samples.size(); ++i) {
    out.select(0, static_cast<int64_t>(i)).copy_(*samples[i].get_if<Tensor>());
  }
  return Sample(out);
}

template <typename T>
absl::StatusOr<Sample> Numbers(const std::vector<Sample>& samples) {
  std::vector<T> values;
  values.reserve(samples.size());
  for (const Sample& s : samples) values.push_back(*s.get_if<T>());
  return Sample(tensor(values));
}

absl::StatusOr<Sample> Collate(const std::vector<Sample>& samples, const std::string& where) {
  const Sample& first = samples[0];
  for (size_t i = 1; i < samples.size(); ++i) {
    if (samples[i].kind() != first.kind()) {
      return Mismatch(
          where, absl::StrCat("sample 0 holds a ", std::string(first.kind()), " and sample ", i,
                              " a ", std::string(samples[i].kind())));
    }
  }
  if (first.is<Tensor>()) return StackTensors(samples, where);
  if (first.is<int64_t>()) return Numbers<int64_t>(samples);
  if (first.is<double>()) return Numbers<double>(samples);
  if (first.is<bool>()) {
    std::vector<int64_t> values;
    for (const Sample& s : samples) values.push_back(*s.get_if<bool>() ? 1 : 0);
    return Sample(tensor(values).to(kBool));
  }
  if (first.is<std::string>()) return Sample(Sample::List(samples.begin(), samples.end()));
  if (first.is<Sample::List>()) {
    const size_t n = first.list().size();
    for (size_t i = 1; i < samples.size(); ++i) {
      if (samples[i].list().size() != n) {
        return Mismatch(where,
                        absl::StrCat("each element in list of batch should be of equal "
                                     "size: sample 0 has ",
                                     n, " and sample ", i, " has ", samples[i].list().size()));
      }
    }
    Sample::List out;
    for (size_t k = 0; k < n; ++k) {
      std::vector<Sample> column;
      column.reserve(samples.size());
      for (const Sample& s : samples) column.push_back(s.list()[k]);
      EMBER_ASSIGN_OR_RETURN(Sample c, Collate(column, absl::StrCat(where, "[", k, "]")));
      out.push_back(std::move(c));
    }
    return Sample(std::move(out));
  }
  if (first.is<Sample::Dict>()) {
    Sample::Dict out;
    for (const auto& [key, unused] : first.dict()) {
      std::vector<Sample> column;
      column.reserve(samples.size());
      for (size_t i = 0; i < samples.size(); ++i) {
        const Sample* v = samples[i].find(key);
        if (v == nullptr) {
          return Mismatch(
              where, absl::StrCat("sample ", i, " has no key '", key, "', which sample 0 has"));
        }
        column.push_back(*v);
      }
      EMBER_ASSIGN_OR_RETURN(Sample c, Collate(column, absl::StrCat(where, "['", key, "']")));
      out.emplace(key, std::move(c));
    }
    return Sample(std::move(out));
  }
  return Mismatch(where, absl::StrCat("batch must contain tensors, numbers, strings, dicts or "
                                      "lists; found ",
                                      std::string(first.kind())));
}

}  // namespace

absl::StatusOr<Sample> default_collate(std::vector<Sample> samples) {
  if (samples.empty()) {
    return absl::InvalidArgumentError("default_collate: the batch has no samples");
  }
  return Collate(samples, "");
}

}  // namespace ember::data
