// Closes every pair of a gloo context with an error, so that whatever waits
// on them inside gloo (a collective's unbound buffers, pending operations)
// throws at once (Note [Aborting gloo] in process_group_gloo.cc). Internal
// to the gloo backend.
//
//   ember::distributed::gloo::FailPairs(*context, rank, size, "the process group was aborted");
//
// Thread-safety: may be called from any thread while other threads wait on
// the pairs; gloo serialises it with its network thread per pair.
// Idempotent per pair: a pair that has already failed keeps its error.
#ifndef EMBER_DISTRIBUTED_GLOO_PAIR_ABORT_H_
#define EMBER_DISTRIBUTED_GLOO_PAIR_ABORT_H_

#include <string>

#include "gloo/context.h"

namespace ember::distributed::gloo {

// For each peer p != rank of `context`'s `size` ranks: gloo's tcp pairs get
// tcp::Pair::signalExceptionExternal(reason) (every buffer and pending
// operation of the pair fails with gloo::IoException, and its socket is
// closed); another transport's pairs get Pair::close(). Returns how many
// pairs were failed; never throws.
int FailPairs(::gloo::Context& context, int rank, int size, const std::string& reason);

}  // namespace ember::distributed::gloo

#endif  // EMBER_DISTRIBUTED_GLOO_PAIR_ABORT_H_
