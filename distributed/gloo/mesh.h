// ConnectFullMesh: the full mesh of a gloo group's tcp pairs, built over an
// Ember Store so that each peer is met in the rendezvous its own gloo speaks
// (Note [Two gloo dialects] in mesh.cc): Debian's libgloo (Ember ranks,
// PyTorch 1.13) or the newer gloo that PyTorch 2.x bundles.
//
//   EMBER_ASSIGN_OR_RETURN(MeshResult mesh,
//                          ConnectFullMesh({.store = store, .group_prefix = "0/", .rank = 1,
//                                           .size = 3, .device = device,
//                                           .timeout = absl::Seconds(30),
//                                           .ember_record_prefix = "0/ember_gloo/proc/"}));
//   // mesh.context is a connected gloo::Context; mesh.newer_gloo[p] says how p met.
//
// The caller writes this rank's Ember record (`ember_record_prefix` + rank)
// before calling: a peer with a record is an Ember rank.
//
// Errors: kUnavailable naming the peer and the address when a connection
// fails; kDeadlineExceeded naming the ranks whose store keys never came;
// kDataLoss when a peer's published address is malformed. Never throws.
// Thread-safety: one call per group, from the creating thread.
#ifndef EMBER_DISTRIBUTED_GLOO_MESH_H_
#define EMBER_DISTRIBUTED_GLOO_MESH_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "distributed/store.h"
#include "gloo/context.h"
#include "gloo/transport/device.h"

namespace ember::distributed::gloo {

struct MeshOptions {
  std::shared_ptr<Store> store;
  std::string group_prefix;  // the group's store prefix, e.g. "default_pg/0/"
  int rank = 0;
  int size = 1;
  std::shared_ptr<::gloo::transport::Device> device;  // gloo's tcp device
  absl::Duration timeout;
  std::string ember_record_prefix;
};

struct MeshResult {
  std::shared_ptr<::gloo::Context> context;
  // Per rank: whether it runs the newer gloo (PyTorch 2.x); false for self.
  std::vector<bool> newer_gloo;
};

absl::StatusOr<MeshResult> ConnectFullMesh(const MeshOptions& options);

// Store keys, for tests: where libgloo's rendezvous puts rank `rank`'s pair
// addresses, and where the newer gloo puts its rank record.
std::string LibglooAddressKey(const std::string& group_prefix, int rank);
std::string NewerGlooRankKey(const std::string& group_prefix, int rank);

}  // namespace ember::distributed::gloo

#endif  // EMBER_DISTRIBUTED_GLOO_MESH_H_
