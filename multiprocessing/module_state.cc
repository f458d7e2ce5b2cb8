#include "multiprocessing/module_state.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "multiprocessing/sharing.h"
#include "tensor/status_macros.h"

namespace ember::multiprocessing {

absl::StatusOr<Value> share_state(const StateDict& state) {
  Value::Dict dict;
  for (const auto& [name, t] : state) {
    EMBER_RETURN_IF_ERROR(share_memory_(t));
    dict.emplace(name, Value(t));
  }
  return Value(std::move(dict));
}

absl::Status load_shared_state(const StateDict& state, const Value& shared) {
  if (!shared.is<Value::Dict>()) {
    return absl::InvalidArgumentError(
        absl::StrCat("load_shared_state: expected the dict share_state made, got a ",
                     std::string(shared.kind())));
  }
  std::vector<std::string> errors;
  std::set<std::string> seen;
  std::vector<std::pair<Storage, Storage>> aliases;
  for (const auto& [name, t] : state) {
    seen.insert(name);
    const Value* v = shared.find(name);
    if (v == nullptr) {
      errors.push_back(absl::StrCat("missing key '", name, "'"));
      continue;
    }
    const Tensor* s = v->get_if<Tensor>();
    if (s == nullptr) {
      errors.push_back(
          absl::StrCat("'", name, "' is a ", std::string(v->kind()), ", not a tensor"));
      continue;
    }
    if (s->dtype() != t.dtype() || s->sizes() != t.sizes() || s->strides() != t.strides() ||
        s->storage_offset() != t.storage_offset() ||
        s->storage().nbytes() != t.storage().nbytes()) {
      errors.push_back(absl::StrCat("'", name, "' is ", std::string(dtype_name(s->dtype())), " [",
                                    absl::StrJoin(s->sizes(), ", "), "] in the shared state but ",
                                    std::string(dtype_name(t.dtype())), " [",
                                    absl::StrJoin(t.sizes(), ", "),
                                    "] here (or its layout differs)"));
      continue;
    }
    if (!is_shared(*s)) {
      errors.push_back(absl::StrCat("'", name, "' is not in shared memory"));
      continue;
    }
    aliases.emplace_back(t.storage(), s->storage());
  }
  for (const auto& [name, v] : shared.dict()) {
    if (!seen.contains(name)) errors.push_back(absl::StrCat("unexpected key '", name, "'"));
  }
  if (!errors.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "load_shared_state: the shared state does not fit this module: ",
        absl::StrJoin(errors, "; "), ". Build the same architecture as the parent's module"));
  }
  for (const auto& [storage, source] : aliases) {
    EMBER_RETURN_IF_ERROR(alias_shared_storage(storage, source));
  }
  return absl::OkStatus();
}

}  // namespace ember::multiprocessing
