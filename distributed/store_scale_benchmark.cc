// TcpStore at the scale a job starts at, as PyTorch's TCPStore is measured
// (testdata/torch_store_bench.py prints the same table for PyTorch 2.x):
//   - per-operation latency of set, get (present key) and add, one client,
//     the server in this process;
//   - a barrier of N clients, each with a connection of its own: connect, add
//     to a counter, the one that makes it N sets a key, then every client
//     waits for that key; in one process, or spread over P forked ones.
//
//   bazel run -c opt //distributed:store_scale_benchmark --
//       [--ops=20000] [--clients=256,1024,4096] [--processes=1,8] [--port=P]
//
// With --port, the clients use the server at 127.0.0.1:P (PyTorch's, say)
// instead of starting Ember's. --serve_for=S only serves, for S seconds,
// printing the port first (for PyTorch's clients: torch_store_bench.py --port).
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "distributed/tcp_store.h"

namespace ember::distributed {
namespace {

std::vector<int> Ints(const std::string& list) {
  std::vector<int> out;
  for (absl::string_view part : absl::StrSplit(list, ',')) {
    int value = 0;
    if (absl::SimpleAtoi(part, &value)) out.push_back(value);
  }
  return out;
}

std::unique_ptr<TcpStore> Client(int port) {
  TcpStoreOptions options;
  options.port = port;
  options.timeout = absl::Seconds(300);
  absl::StatusOr<std::unique_ptr<TcpStore>> store = TcpStore::create(options);
  if (!store.ok()) {
    std::fprintf(stderr, "%s\n", std::string(store.status().message()).c_str());
    std::exit(1);
  }
  return std::move(*store);
}

// Median microseconds of `ops` calls of `op`.
template <typename Op>
double MedianMicros(int ops, Op op) {
  std::vector<double> us(ops);
  for (int i = 0; i < ops; ++i) {
    absl::Time start = absl::Now();
    op(i);
    us[i] = absl::ToDoubleMicroseconds(absl::Now() - start);
  }
  std::nth_element(us.begin(), us.begin() + ops / 2, us.end());
  return us[ops / 2];
}

// `clients` clients of the barrier (of `total`) in this process.
void BarrierClients(int port, int clients, int total, const std::string& round) {
  std::vector<std::unique_ptr<TcpStore>> stores;
  stores.reserve(clients);
  for (int i = 0; i < clients; ++i) {
    stores.push_back(Client(port));
    absl::StatusOr<int64_t> arrived = stores.back()->add(round + "/arrived", 1);
    if (!arrived.ok()) std::exit(2);
    if (*arrived == total && !stores.back()->set(round + "/go", "1").ok()) std::exit(3);
  }
  for (auto& store : stores) {
    if (!store->wait({round + "/go"}, absl::Seconds(300)).ok()) std::exit(4);
  }
}

double BarrierSeconds(int port, int clients, int processes, const std::string& round) {
  absl::Time start = absl::Now();
  if (processes == 1) {
    BarrierClients(port, clients, clients, round);
  } else {
    std::vector<pid_t> children;
    for (int p = 0; p < processes; ++p) {
      const int mine = clients / processes + (p < clients % processes ? 1 : 0);
      pid_t pid = fork();
      if (pid == 0) {
        BarrierClients(port, mine, clients, round);
        _exit(0);
      }
      children.push_back(pid);
    }
    for (pid_t pid : children) {
      int status = 0;
      waitpid(pid, &status, 0);
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        std::fprintf(stderr, "a barrier process failed (status %d)\n", status);
        std::exit(5);
      }
    }
  }
  return absl::ToDoubleSeconds(absl::Now() - start);
}

int Main(int argc, char** argv) {
  int ops = 20000;
  int port = 0;
  int serve_for = 0;
  std::vector<int> clients = {256, 1024, 4096};
  std::vector<int> processes = {1, 8};
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&](const char* name) -> const char* {
      const std::string prefix = std::string(name) + "=";
      return arg.rfind(prefix, 0) == 0 ? argv[i] + prefix.size() : nullptr;
    };
    if (const char* v = value("--ops")) ops = std::atoi(v);
    else if (const char* v = value("--port")) port = std::atoi(v);
    else if (const char* v = value("--serve_for")) serve_for = std::atoi(v);
    else if (const char* v = value("--clients")) clients = Ints(v);
    else if (const char* v = value("--processes")) processes = Ints(v);
    else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 1;
    }
  }
  rlimit limit = {};
  getrlimit(RLIMIT_NOFILE, &limit);
  limit.rlim_cur = limit.rlim_max;
  setrlimit(RLIMIT_NOFILE, &limit);

  std::unique_ptr<TcpStoreServer> server;
  if (port == 0) {
    TcpStoreServerOptions options;
    options.max_pending_waits = 1 << 20;
    server = TcpStoreServer::start(options).value();
    port = server->port();
  }
  if (serve_for > 0) {
    std::printf("%d\n", port);
    std::fflush(stdout);
    absl::SleepFor(absl::Seconds(serve_for));
    return 0;
  }
  std::unique_ptr<TcpStore> store = Client(port);
  const std::string value(32, 'v');
  (void)store->set("bench/present", value);
  std::printf("TcpStore (Ember's client, %s server), %d ops each\n",
              server != nullptr ? "Ember's" : "another", ops);
  std::printf("  set   %8.1f us\n", MedianMicros(ops, [&](int i) {
                (void)store->set("bench/k" + std::to_string(i % 64), value);
              }));
  std::printf("  get   %8.1f us\n",
              MedianMicros(ops, [&](int) { (void)store->get("bench/present"); }));
  std::printf("  add   %8.1f us\n", MedianMicros(ops, [&](int) { (void)store->add("bench/n", 1); }));
  int round = 0;
  for (int p : processes) {
    for (int n : clients) {
      double seconds = BarrierSeconds(port, n, p, "barrier/" + std::to_string(round++));
      std::printf("  barrier of %5d clients in %d process%s: %7.3f s\n", n, p, p == 1 ? "" : "es",
                  seconds);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace
}  // namespace ember::distributed

int main(int argc, char** argv) { return ember::distributed::Main(argc, argv); }
