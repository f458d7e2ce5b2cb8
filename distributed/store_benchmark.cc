// Latency of one store operation (Set, Get of a present key, Add) for each
// Store, next to the baseline a networked store cannot beat: one 32-byte
// request/reply round trip over a loopback TCP socket with an echo thread.
// TcpStore's figure over the baseline is the cost of its client and server.
//
//   bazel run //distributed:store_benchmark
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "benchmark/benchmark.h"
#include "distributed/file_store.h"
#include "distributed/hash_store.h"
#include "distributed/tcp_store.h"

namespace ember::distributed {
namespace {

const std::string kValue(32, 'v');

void BM_LoopbackRoundTrip(benchmark::State& state) {
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  listen(listener, 1);
  socklen_t len = sizeof(addr);
  getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  std::thread echo([listener] {
    int fd = accept(listener, nullptr, nullptr);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    char buffer[32];
    while (read(fd, buffer, sizeof(buffer)) == sizeof(buffer)) {
      if (write(fd, buffer, sizeof(buffer)) != sizeof(buffer)) break;
    }
    close(fd);
  });
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  char buffer[32] = {};
  for (auto _ : state) {
    if (write(fd, buffer, sizeof(buffer)) != sizeof(buffer) || read(fd, buffer, sizeof(buffer)) != sizeof(buffer)) {
      state.SkipWithError("loopback echo failed");
      break;
    }
  }
  close(fd);
  echo.join();
  close(listener);
}
BENCHMARK(BM_LoopbackRoundTrip)->UseRealTime();

// op: 0 Set, 1 Get, 2 Add.
void RunOp(benchmark::State& state, Store& store) {
  if (!store.set("key", kValue).ok()) state.SkipWithError("Set failed");
  const int op = state.range(0);
  for (auto _ : state) {
    bool ok = op == 0 ? store.set("key", kValue).ok()
              : op == 1 ? store.get("key", absl::Seconds(10)).ok()
                        : store.add("counter", 1).ok();
    if (!ok) {
      state.SkipWithError("store operation failed");
      break;
    }
  }
  state.SetLabel(op == 0 ? "Set" : op == 1 ? "Get" : "Add");
}

void BM_TcpStore(benchmark::State& state) {
  auto server = TcpStoreServer::start({}).value();
  TcpStoreOptions options;
  options.port = server->port();
  auto store = TcpStore::create(options).value();
  RunOp(state, *store);
}
BENCHMARK(BM_TcpStore)->Arg(0)->Arg(1)->Arg(2)->UseRealTime();

void BM_FileStore(benchmark::State& state) {
  const char* dir = std::getenv("TEST_TMPDIR");
  std::string path = std::string(dir ? dir : "/tmp") + "/store_benchmark." + std::to_string(getpid());
  auto store = FileStore::open(path).value();
  RunOp(state, *store);
}
BENCHMARK(BM_FileStore)->Arg(0)->Arg(1)->Arg(2)->UseRealTime();

void BM_HashStore(benchmark::State& state) {
  HashStore store;
  RunOp(state, store);
}
BENCHMARK(BM_HashStore)->Arg(0)->Arg(1)->Arg(2)->UseRealTime();

}  // namespace
}  // namespace ember::distributed
