// Loading a model from a published repository, as torch.hub.load.
//
//   ```cpp compile-only
//   #include "hub/load.h"
//   ember::hub::LoadOptions opts;
//   opts.pretrained = true;                           // the published weights
//   opts.kwargs = {{"num_classes", int64_t{10}}};     // passed on to the builder
//   EMBER_ASSIGN_OR_RETURN(std::shared_ptr<ember::nn::Module> model,
//                          ember::hub::load("alice/models:v1", "resnet18", opts));
//
//   // torch.hub.load('pytorch/vision', 'resnet18', pretrained=True): a
//   // hubconf.py repository, torchvision's ImageNet weights.
//   ember::hub::LoadOptions vision;
//   vision.pretrained = true;  // or vision.args = {true}: resnet18(True)
//   EMBER_ASSIGN_OR_RETURN(std::shared_ptr<ember::nn::Module> resnet,
//                          ember::hub::load("pytorch/vision", "resnet18", vision));
//   ```
//
// load opens the repository (hub.h: fetched and cached, or a local folder),
// checks that this program provides every `dependencies` entry of its
// hubconf, finds the entry point, binds the call's arguments (below), builds
// its module with the entry's default kwargs overridden by the call's
// (builders.h), and with pretrained = true loads the entry's weights:
//   - for a hubconf.textproto entry, what it publishes: a repository file
//     (its sha256 checked when given) or a URL fetched with
//     load_state_dict_from_url (its sha256 checked on download and before
//     each load; an http:// URL only when it is on the host of a plain-http
//     base URL the caller set);
//   - for a hubconf.py entry (built by the registered builder of the same
//     name), the weights that builder publishes (builders.h: resnet18 ->
//     torchvision's resnet18-f37072fd.pth), fetched with
//     load_state_dict_from_url and check_hash (the hex in the file name must
//     begin the file's SHA-256) into <hub_dir>/checkpoints, from
//     <weights base>/<file name>: the weights base is
//     LoadOptions::weights_base_url, else $EMBER_HUB_WEIGHTS_BASE_URL, else
//     the builder's own (https://download.pytorch.org/models). Point it at a
//     mirror holding the same file names.
// The module is returned in training mode, as torch.hub.load does; call
// eval() for inference.
//
// Arguments, as torch.hub.load(repo, model, *args, **kwargs) passes them to
// the entry point: `args` bind, in order, to the entry point's `positional`
// parameters (hubconf.proto: a hubconf.py def's parameters before `*` /
// `*args` / `**kwargs`; a hubconf.textproto lists them), then `kwargs` add
// the rest; a parameter given both ways, or more args than parameters, is
// InvalidArgument, as in Python. `pretrained` and `progress` (bools) belong
// to the entry point and never reach the builder: `pretrained` given as an
// argument decides it (and may not also be set in LoadOptions::pretrained),
// `progress=false` turns the download's progress bar off.
//
// Thread-safety: safe from any thread and any process.
#ifndef EMBER_HUB_LOAD_H_
#define EMBER_HUB_LOAD_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "hub/builders.h"
#include "hub/hub.h"
#include "nn/module.h"

namespace ember::hub {

// Overrides the base URL of every builder's published weights (a mirror of
// download.pytorch.org/models); LoadOptions::weights_base_url wins over it.
inline constexpr char kWeightsBaseUrlEnv[] = "EMBER_HUB_WEIGHTS_BASE_URL";

struct LoadOptions : HubOptions {
  // false: freshly initialised weights; true: the entry point's published
  // weights.
  bool pretrained = false;
  // Positional arguments (torch.hub.load's *args), bound to the entry
  // point's `positional` parameters in order.
  std::vector<Arg> args;
  // Keyword arguments: for the builder, overriding the entry point's
  // defaults (and `pretrained` / `progress`, see above).
  Kwargs kwargs;
  // Where builder-published weights come from (see above); empty:
  // $EMBER_HUB_WEIGHTS_BASE_URL, else the builder's own.
  std::string weights_base_url;
};

// See above. Blocks on the network unless the repository and its weights are
// cached. Errors: open_repository's; FailedPrecondition listing missing
// dependencies, or for pretrained = true on an entry without weights (a
// hubconf.textproto entry that publishes none; a hubconf.py entry whose
// builder publishes none); NotFound for an unknown entry point or builder
// (for a hubconf.py entry: naming it and the registered builders);
// PermissionDenied for weights over plain http from another host;
// InvalidArgument for bad kwargs, too many positional arguments, an argument
// given twice, a non-bool pretrained/progress, or weights that do not fit
// the module (load_state_dict's message); DataLoss for a weights hash
// mismatch; download errors (download.h).
absl::StatusOr<std::shared_ptr<nn::Module>> load(const std::string& repo, const std::string& entry,
                                                 const LoadOptions& options = {});

}  // namespace ember::hub

#endif  // EMBER_HUB_LOAD_H_
