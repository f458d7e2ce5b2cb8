// Linked into a test binary, makes every backward of that binary run its CPU
// nodes on the engine's worker thread (internal::SetCpuNodesOnWorkerForTesting),
// so the whole autograd suite also runs through the hand-off of Note [Device
// workers] in engine.cc: the `*_on_worker` tests of BUILD.bazel.
#include "autograd/engine.h"

namespace ember::autograd {
namespace {

struct CpuNodesOnWorker {
  CpuNodesOnWorker() { internal::SetCpuNodesOnWorkerForTesting(true); }
};
const CpuNodesOnWorker cpu_nodes_on_worker;

}  // namespace
}  // namespace ember::autograd
