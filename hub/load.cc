#include "hub/load.h"

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <variant>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "hub/load_state_dict_from_url.h"
#include "hub/repo_cache.h"
#include "hub/sha256.h"
#include "serialization/printable.h"
#include "serialization/serialization.h"
#include "tensor/status_macros.h"

namespace ember::hub {

using ::ember::serialization::escape_for_terminal;

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

absl::StatusOr<StateDict> EntryWeights(const Repository& repo, const EntryPoint& e,
                                       const LoadOptions& options, bool progress) {
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
    from_url.progress = progress;
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
  return ember::load(path);
}

// Note [Builder weights]
// A hubconf.py entry point's weights are fetched by Python code Ember does
// not run; what that code fetches for torchvision's models is known, though
// (torchvision's own model code names each file), so the C++ builder that
// mirrors a model carries the same file name. The file name's hash prefix is
// always checked (check_hash), as torchvision loads its weights, so a mirror
// or cache cannot hand over other bytes. The base URL is the caller's to
// move (a mirror, an offline copy, a test server); plain http is then the
// caller's choice, as for EMBER_HUB_BASE_URL.
//
// The weights a builder publishes, from the base URL the caller chose or the
// builder's own.
absl::StatusOr<StateDict> BuilderWeights(const PublishedWeights& w, const LoadOptions& options,
                                         bool progress) {
  std::string base = options.weights_base_url;
  if (base.empty()) {
    const char* env = std::getenv(kWeightsBaseUrlEnv);
    if (env != nullptr) base = env;
  }
  if (base.empty()) base = w.base_url;
  while (!base.empty() && base.back() == '/') base.pop_back();
  LoadFromUrlOptions from_url;
  from_url.check_hash = true;
  from_url.progress = progress;
  from_url.download = options.download;
  return load_state_dict_from_url(absl::StrCat(base, "/", w.file_name), from_url);
}

// What a call passes: the entry point's own arguments (pretrained, progress)
// and the builder's kwargs, after binding positional arguments.
struct CallArguments {
  bool pretrained = false;
  bool progress = true;
  Kwargs kwargs;
};

std::string ArgText(const Arg& a) {
  switch (a.index()) {
    case 0:
      return absl::StrCat("int ", std::get<int64_t>(a));
    case 1:
      return absl::StrCat("float ", std::get<double>(a));
    case 2:
      return std::get<bool>(a) ? "True" : "False";
    default:
      return absl::StrCat("string '", escape_for_terminal(std::get<std::string>(a)), "'");
  }
}

// Binds options.args to the entry point's positional parameters as Python
// does (too many is an error; a parameter bound twice is an error), then
// takes out `pretrained` and `progress`, which the entry point itself takes.
absl::StatusOr<CallArguments> BindArguments(const std::string& repo, const EntryPoint& e,
                                            const LoadOptions& options) {
  const std::string who = absl::StrCat("entry point ", e.name(), " of ", repo);
  if (options.args.size() > static_cast<size_t>(e.positional_size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, " takes ", e.positional_size(), " positional argument",
        e.positional_size() == 1 ? "" : "s",
        e.positional().empty() ? "" : absl::StrCat(" (", absl::StrJoin(e.positional(), ", "), ")"),
        " but ", options.args.size(), options.args.size() == 1 ? " was" : " were",
        " given; pass the others in kwargs"));
  }
  CallArguments call;
  call.kwargs = options.kwargs;
  for (size_t i = 0; i < options.args.size(); ++i) {
    const std::string& name = e.positional(static_cast<int>(i));
    if (!call.kwargs.emplace(name, options.args[i]).second) {
      return absl::InvalidArgumentError(absl::StrCat(who, " got multiple values for argument '",
                                                     name, "' (positional argument ", i + 1,
                                                     " and a kwarg); give it once"));
    }
  }
  call.pretrained = options.pretrained;
  call.progress = options.download.progress;
  for (const char* own : {"pretrained", "progress"}) {
    auto it = call.kwargs.find(own);
    if (it == call.kwargs.end()) continue;
    const bool* value = std::get_if<bool>(&it->second);
    if (value == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": argument '", own, "' must be a bool, got ", ArgText(it->second)));
    }
    if (it->first == "pretrained") {
      if (options.pretrained) {
        return absl::InvalidArgumentError(absl::StrCat(
            who, " got multiple values for argument 'pretrained' (LoadOptions::pretrained and ",
            "an argument); give it once"));
      }
      call.pretrained = *value;
    } else {
      call.progress = *value && options.download.progress;
    }
    call.kwargs.erase(it);
  }
  return call;
}

}  // namespace

absl::StatusOr<std::shared_ptr<nn::Module>> load(const std::string& repo, const std::string& entry,
                                                 const LoadOptions& options) {
  EMBER_ASSIGN_OR_RETURN(Repository r, open_repository(repo, options));
  EMBER_RETURN_IF_ERROR(check_dependencies(r.conf, builder_names()));
  EMBER_ASSIGN_OR_RETURN(const EntryPoint* e, get_entry_point(r.conf, entry, r.dir));
  if (e->python()) {
    const std::vector<std::string> builders = builder_names();
    if (std::find(builders.begin(), builders.end(), e->builder()) == builders.end()) {
      return absl::NotFoundError(absl::StrCat(
          "entry point ", entry, " of ", repo,
          " is a Python function in its hubconf.py, which Ember does not run; it loads a "
          "hubconf.py entry point only through a C++ builder of the same name, and none is "
          "registered (builders: ",
          absl::StrJoin(builders, ", "),
          "). Register one with register_builder, or publish a hubconf.textproto"));
    }
  }
  EMBER_ASSIGN_OR_RETURN(CallArguments call, BindArguments(repo, *e, options));
  Kwargs kwargs;
  for (const auto& [name, value] : e->kwargs()) kwargs[name] = FromProto(value);
  for (const auto& [name, value] : call.kwargs) kwargs[name] = value;
  EMBER_ASSIGN_OR_RETURN(std::shared_ptr<nn::Module> module, build(e->builder(), kwargs));
  if (!call.pretrained) return module;
  absl::StatusOr<StateDict> weights;
  if (e->has_weights()) {
    weights = EntryWeights(r, *e, options, call.progress);
  } else if (std::optional<PublishedWeights> w = builder_weights(e->builder()); w && e->python()) {
    weights = BuilderWeights(*w, options, call.progress);
  } else if (e->python()) {
    std::vector<std::string> with_weights;
    for (const std::string& b : builder_names()) {
      if (builder_weights(b)) with_weights.push_back(b);
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "entry point ", entry, " of ", repo, " is a hubconf.py function whose builder '",
        e->builder(), "' was registered without published weights (builders with weights: ",
        absl::StrJoin(with_weights, ", "),
        "); load it with pretrained = false, or register the builder with its PublishedWeights"));
  } else {
    return absl::FailedPreconditionError(
        absl::StrCat("entry point ", entry, " of ", repo,
                     " publishes no weights; load it with pretrained = false"));
  }
  if (!weights.ok()) return weights.status();
  absl::Status loaded = module->load_state_dict(*weights);
  if (!loaded.ok()) {
    return absl::Status(loaded.code(), absl::StrCat("pretrained weights of ", repo, " ", entry,
                                                    ": ", loaded.message()));
  }
  return module;
}

}  // namespace ember::hub
