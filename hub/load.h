// Loading a model from a published repository, as torch.hub.load.
//
//   ```cpp compile-only
//   #include "hub/load.h"
//   ember::hub::LoadOptions opts;
//   opts.pretrained = true;                           // the published weights
//   opts.kwargs = {{"num_classes", int64_t{10}}};     // passed on to the builder
//   EMBER_ASSIGN_OR_RETURN(std::shared_ptr<ember::nn::Module> model,
//                          ember::hub::load("alice/models:v1", "resnet18", opts));
//   ```
//
// load opens the repository (hub.h: fetched and cached, or a local folder),
// checks that this program provides every `dependencies` entry of its
// hubconf, finds the entry point, builds its module with the entry's default
// kwargs overridden by `kwargs` (builders.h), and with pretrained = true
// loads the entry's weights: a repository file (its sha256 checked when
// given) or a URL fetched with load_state_dict_from_url (its sha256 checked
// on download and before each load; an http:// URL only when it is on the
// host of a plain-http base URL the caller set). An entry point read from a
// hubconf.py is built by the registered builder of the same name. The module is returned in
// training mode, as torch.hub.load does; call eval() for inference.
//
// Thread-safety: safe from any thread and any process.
#ifndef EMBER_HUB_LOAD_H_
#define EMBER_HUB_LOAD_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "hub/builders.h"
#include "hub/hub.h"
#include "nn/module.h"

namespace ember::hub {

struct LoadOptions : HubOptions {
  // false: freshly initialised weights; true: the entry point's published
  // weights.
  bool pretrained = false;
  // Arguments for the builder, overriding the entry point's defaults.
  Kwargs kwargs;
};

// See above. Blocks on the network unless the repository and its weights are
// cached. Errors: OpenRepository's; FailedPrecondition listing missing
// dependencies, or for pretrained = true on an entry without weights (every
// hubconf.py entry); NotFound for an unknown entry point or builder (for a
// hubconf.py entry: naming it and the registered builders);
// PermissionDenied for weights over plain http from another host; InvalidArgument for bad
// kwargs or weights that do not fit the module (load_state_dict's message);
// DataLoss for a weights hash mismatch; download errors (download.h).
absl::StatusOr<std::shared_ptr<nn::Module>> load(const std::string& repo, const std::string& entry,
                                                 const LoadOptions& options = {});

}  // namespace ember::hub

#endif  // EMBER_HUB_LOAD_H_
