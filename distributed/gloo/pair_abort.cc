#include "distributed/gloo/pair_abort.h"

#include <exception>
#include <memory>

#include "gloo/transport/pair.h"
#include "gloo/transport/tcp/pair.h"

namespace ember::distributed::gloo {
namespace {

// tcp::Pair::signalExceptionExternal is protected (gloo's own buffers call
// it on a timeout); a derived class may name it, and hands out the member
// pointer. Never instantiated.
struct PairAccess : ::gloo::transport::tcp::Pair {
  static constexpr auto kSignal = &PairAccess::signalExceptionExternal;
};

}  // namespace

int FailPairs(::gloo::Context& context, int rank, int size, const std::string& reason) {
  int failed = 0;
  for (int p = 0; p < size; ++p) {
    if (p == rank) continue;
    try {
      std::unique_ptr<::gloo::transport::Pair>& pair = context.getPair(p);
      if (pair == nullptr) continue;
      if (auto* tcp = dynamic_cast<::gloo::transport::tcp::Pair*>(pair.get())) {
        (void)(tcp->*PairAccess::kSignal)(reason);
      } else {
        pair->close();
      }
      ++failed;
    } catch (const std::exception&) {
      // A pair that was never connected has no waiter to wake.
    }
  }
  return failed;
}

}  // namespace ember::distributed::gloo
