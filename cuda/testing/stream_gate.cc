#include "cuda/testing/stream_gate.h"

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace ember::cuda::testing {

struct StreamGate::State {
  explicit State(absl::Duration give_up) : give_up(give_up) {}
  const absl::Duration give_up;
  absl::Mutex mu;
  bool open ABSL_GUARDED_BY(mu) = false;
  bool gave_up ABSL_GUARDED_BY(mu) = false;

  // The host function: runs on CUDA's callback thread when the stream
  // reaches it and holds the stream until the gate opens. Owns one reference
  // to the state, so the gate may be destroyed first. Makes no CUDA calls
  // (host functions must not).
  static void CUDART_CB Wait(void* arg) {
    std::unique_ptr<std::shared_ptr<State>> ref(static_cast<std::shared_ptr<State>*>(arg));
    State& s = **ref;
    absl::MutexLock lock(&s.mu);
    if (!s.mu.AwaitWithTimeout(absl::Condition(&s.open), s.give_up)) s.gave_up = true;
  }
};

StreamGate::StreamGate(absl::Duration give_up) : state_(std::make_shared<State>(give_up)) {}

StreamGate::~StreamGate() { Open(); }

absl::Status StreamGate::Close(cudaStream_t stream) {
  auto* ref = new std::shared_ptr<State>(state_);
  const cudaError_t error = cudaLaunchHostFunc(stream, &State::Wait, ref);
  if (error != cudaSuccess) {
    delete ref;  // never runs
    return absl::InternalError(absl::StrCat("cudaLaunchHostFunc (closing a stream gate): ",
                                            cudaGetErrorName(error), ": ",
                                            cudaGetErrorString(error)));
  }
  return absl::OkStatus();
}

void StreamGate::Open() {
  absl::MutexLock lock(&state_->mu);
  state_->open = true;
}

bool StreamGate::gave_up() const {
  absl::MutexLock lock(&state_->mu);
  return state_->gave_up;
}

}  // namespace ember::cuda::testing
