// GlooStore: gloo's rendezvous store interface (gloo::rendezvous::Store) over
// an Ember Store, so that gloo contexts meet through the same store as the
// rest of the job (TcpStore, FileStore, HashStore, PrefixStore).
//
//   GlooStore store(ember_store, "group/gloo/", absl::Seconds(30));
//   context->connectFullMesh(store, device);  // throws gloo::IoException on failure
//
// Every key is put under `prefix`. get/wait block at most `timeout` (the
// group's timeout) and throw gloo::IoException naming the keys on failure:
// exceptions are how gloo's code expects a store to fail, and the backend
// catches them at its boundary (Note [gloo exceptions] in
// process_group_gloo.cc).
//
// Thread-safety: as the underlying Store.
#ifndef EMBER_DISTRIBUTED_GLOO_STORE_ADAPTER_H_
#define EMBER_DISTRIBUTED_GLOO_STORE_ADAPTER_H_

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "distributed/store.h"
#include "gloo/rendezvous/store.h"

namespace ember::distributed::gloo {

class GlooStore : public ::gloo::rendezvous::Store {
 public:
  GlooStore(std::shared_ptr<distributed::Store> store, std::string prefix, absl::Duration timeout);

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  std::shared_ptr<distributed::Store> store_;
  const std::string prefix_;
  const absl::Duration timeout_;
};

}  // namespace ember::distributed::gloo

#endif  // EMBER_DISTRIBUTED_GLOO_STORE_ADAPTER_H_
