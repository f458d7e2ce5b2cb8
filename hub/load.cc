#include "hub/load.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "hub/checkpoint.h"
#include "hub/load_state_dict_from_url.h"
#include "hub/printable.h"
#include "hub/repo_cache.h"
#include "hub/sha256.h"
#include "tensor/status_macros.h"

namespace ember::hub {
namespace {

Arg FromProto(const ArgValue& v) {
  switch (v.kind_case()) {
    case ArgValue::kIntValue:
      return v.int_value();
    case ArgValue::kFloatValue:
      return v.float_value();
    case ArgValue::kBoolValue:
      return v.bool_value();
    default:
      return v.string_value();
  }
}

absl::StatusOr<StateDict> PublishedWeights(const Repository& repo, const EntryPoint& e,
                                           const LoadOptions& options) {
  const Weights& w = e.weights();
  if (const std::string origin = url_origin(w.url()); absl::StartsWith(origin, "http://")) {
    // Plain http only from the host of a plain-http base URL the user chose
    // (a local mirror or test server), never on the repository's word alone.
    FetchOptions fetch;
    fetch.base_url = options.base_url;
    if (url_origin(resolve_base_url(fetch)) != origin) {
      return absl::PermissionDeniedError(absl::StrCat(
          "entry point ", e.name(), " publishes its weights over plain http (",
          escape_for_terminal(w.url()),
          "); Ember fetches published weights over https, or over http only from the host of an "
          "http base URL you set (base_url / ",
          kBaseUrlEnv, ")"));
    }
  }
  if (!w.url().empty()) {
    LoadFromUrlOptions from_url;
    from_url.sha256 = w.sha256();
    from_url.progress = options.download.progress;
    from_url.download = options.download;
    return load_state_dict_from_url(w.url(), from_url);
  }
  const std::string path = absl::StrCat(repo.dir, "/", w.file());
  if (!w.sha256().empty()) {
    EMBER_ASSIGN_OR_RETURN(std::string digest, sha256_of_file(path));
    if (!absl::StartsWith(digest, w.sha256())) {
      return absl::DataLossError(absl::StrCat("weights ", path, " have SHA-256 ", digest,
                                              ", not the published '", w.sha256(),
                                              "'; reload the repository with force_reload"));
    }
  }
  return load_checkpoint(path);
}

}  // namespace

absl::StatusOr<std::shared_ptr<nn::Module>> load(const std::string& repo, const std::string& entry,
                                                 const LoadOptions& options) {
  EMBER_ASSIGN_OR_RETURN(Repository r, open_repository(repo, options));
  EMBER_RETURN_IF_ERROR(check_dependencies(r.conf, builder_names()));
  EMBER_ASSIGN_OR_RETURN(const EntryPoint* e, get_entry_point(r, entry));
  if (e->python()) {
    const std::vector<std::string> builders = builder_names();
    if (std::find(builders.begin(), builders.end(), e->builder()) == builders.end()) {
      return absl::NotFoundError(absl::StrCat(
          "entry point ", entry, " of ", repo,
          " is a Python function in its hubconf.py, which Ember does not run; it loads a "
          "hubconf.py entry point only through a C++ builder of the same name, and none is "
          "registered (builders: ",
          absl::StrJoin(builders, ", "),
          "). Register one with RegisterBuilder, or publish a hubconf.textproto"));
    }
    if (options.pretrained) {
      return absl::FailedPreconditionError(absl::StrCat(
          "entry point ", entry, " of ", repo,
          " is a hubconf.py function: its pretrained weights are fetched by Python code Ember does "
          "not run. Load it with pretrained = false and load the weights with "
          "LoadStateDictFromUrl, or publish them in a hubconf.textproto"));
    }
  }
  Kwargs kwargs;
  for (const auto& [name, value] : e->kwargs()) kwargs[name] = FromProto(value);
  for (const auto& [name, value] : options.kwargs) kwargs[name] = value;
  EMBER_ASSIGN_OR_RETURN(std::shared_ptr<nn::Module> module, build(e->builder(), kwargs));
  if (!options.pretrained) return module;
  if (!e->has_weights()) {
    return absl::FailedPreconditionError(
        absl::StrCat("entry point ", entry, " of ", repo,
                     " publishes no weights; load it with pretrained = false"));
  }
  EMBER_ASSIGN_OR_RETURN(StateDict weights, PublishedWeights(r, *e, options));
  absl::Status loaded = module->load_state_dict(weights);
  if (!loaded.ok()) {
    return absl::Status(loaded.code(), absl::StrCat("pretrained weights of ", repo, " ", entry,
                                                    ": ", loaded.message()));
  }
  return module;
}

}  // namespace ember::hub
