#include "distributed/rendezvous.h"

namespace ember::distributed {

absl::StatusOr<RendezvousResult> Rendezvous(const RendezvousOptions& options) {
  return absl::UnimplementedError("Rendezvous: init methods are not implemented yet");
}

}  // namespace ember::distributed
