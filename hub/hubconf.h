// HubConf: what a repository publishes, read from its hubconf.textproto.
//
//   ```cpp
//   #include "hub/hubconf.h"
//   std::string text = R"pb(
//     entry_points { name: "mlp" doc: "A small MLP." builder: "mlp" }
//   )pb";
//   EMBER_ASSIGN_OR_RETURN(ember::hub::HubConf conf,
//                          ember::hub::parse_hubconf(text, "alice/models/hubconf.textproto"));
//   EMBER_ASSIGN_OR_RETURN(const ember::hub::EntryPoint* e,
//                          ember::hub::get_entry_point(conf, "mlp", "alice/models"));
//   if (e->doc() != "A small MLP.") return absl::InternalError("not the mlp entry");
//   ```
//
// The schema is hub/hubconf.proto. Parsing checks the file's own consistency
// (unique entry names that are identifiers, a builder per entry, weights
// given as a file or as an https URL with its SHA-256); whether the builders
// exist is the loader's check (check_dependencies). A repository may publish a
// PyTorch-hub hubconf.py instead, read without running it (hubconf_py.h,
// which also holds read_hubconf: whichever of the two files a repository
// publishes; when both exist, hubconf.textproto wins).
//
// Thread-safety: free functions on values; safe from any thread.
#ifndef EMBER_HUB_HUBCONF_H_
#define EMBER_HUB_HUBCONF_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "hub/hubconf.pb.h"

namespace ember::hub {

// The file a repository publishes at its root.
inline constexpr char kHubConfFile[] = "hubconf.textproto";

// Parses and validates hubconf text. `source` names the file in messages.
// Errors: InvalidArgument naming the source, the line/column or the entry
// and what to fix.
absl::StatusOr<HubConf> parse_hubconf(absl::string_view text, absl::string_view source);

// OK when `name` may name an entry point: an ASCII identifier as a Python
// def name is ([A-Za-z_][A-Za-z0-9_]*, not a keyword). Names go to
// terminals and file names, so nothing else is accepted. Errors:
// InvalidArgument naming `where` and the (escaped) name.
absl::Status check_entry_point_name(absl::string_view name, absl::string_view where);

// Scheme and host[:port] of `url` ("https://a.org:8443/x" ->
// "https://a.org:8443"), lower-cased; "" when it has no "://".
std::string url_origin(absl::string_view url);

// The entry point called `name` (torch.hub's lookup of a callable in a
// hubconf). Errors: NotFound naming `where` (the repository) and listing the
// entry points there are.
absl::StatusOr<const EntryPoint*> get_entry_point(const HubConf& conf, absl::string_view name,
                                                  absl::string_view where);

// FailedPrecondition listing every dependency of `conf` missing from
// `available` (and what is available); OK when none is missing.
absl::Status check_dependencies(const HubConf& conf, const std::vector<std::string>& available);

}  // namespace ember::hub

#endif  // EMBER_HUB_HUBCONF_H_
