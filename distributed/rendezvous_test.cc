// Rendezvous: every init method with ranks as threads and as processes (this
// binary re-run as each rank), groups sharing an address or file, and the
// mistakes that must fail fast with the offending name: bad URLs, missing or
// contradictory variables, world_size 0, rank >= world_size, a port in use,
// ranks that never arrive, a rank given twice.
#include "distributed/rendezvous.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "distributed/tcp_store.h"
#include "distributed/testing/free_port.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ember::distributed {
namespace {

using ::ember::distributed::testing::FreePort;

using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  static std::atomic<int> counter{0};
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir ? dir : "/tmp", "/", name, ".", getpid(), ".", counter++);
}

// A multicast group address unlikely to be shared with another test run.
std::string MulticastUrl() {
  return absl::StrCat("tcp://239.255.", getpid() % 250, ".", 1 + getpid() / 250 % 250, ":",
                      FreePort());
}

// The same in IPv6 (an ff15::/16 transient, site-local group), in the form
// torch's docs show: tcp://[ff15:1e18:5d4c:4cf0:d02d:b659:53ba:b0a7]:23456.
std::string Ipv6MulticastUrl() {
  return absl::StrCat("tcp://[ff15:1e18:5d4c:4cf0:d02d:", absl::Hex(getpid() % 65536),
                      ":53ba:b0a7]:", FreePort());
}

// Runs `world_size` ranks as threads; each gets options from `make(rank)`.
std::vector<absl::StatusOr<RendezvousResult>> RunThreads(
    int world_size, std::function<RendezvousOptions(int)> make) {
  std::vector<absl::StatusOr<RendezvousResult>> results(world_size, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] { results[r] = rendezvous(make(r)); });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

// Checks that the ranks form one job: ranks 0..N-1 once each, one store.
void ExpectOneJob(std::vector<absl::StatusOr<RendezvousResult>>& results) {
  const int n = results.size();
  std::set<int> ranks;
  for (auto& result : results) {
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->world_size, n);
    ranks.insert(result->rank);
    ASSERT_TRUE(result->store->set(absl::StrCat("hello/", result->rank), "hi").ok());
  }
  EXPECT_EQ(ranks.size(), static_cast<size_t>(n));
  EXPECT_EQ(*ranks.begin(), 0);
  EXPECT_EQ(*ranks.rbegin(), n - 1);
  for (auto& result : results) {
    for (int r = 0; r < n; ++r)
      EXPECT_EQ(result->store->get(absl::StrCat("hello/", r), absl::Seconds(5)).value(), "hi");
  }
}

bool MulticastUnavailable(const absl::Status& status) {
  return status.code() == absl::StatusCode::kUnavailable &&
         absl::StrContains(status.message(), "multicast route");
}

TEST(RendezvousThreadsTest, Tcp) {
  const std::string url = absl::StrCat("tcp://127.0.0.1:", FreePort());
  auto results = RunThreads(3, [&](int r) {
    return RendezvousOptions{
        .init_method = url, .world_size = 3, .rank = r, .timeout = absl::Seconds(20)};
  });
  ExpectOneJob(results);
}

// PyTorch ranks join a TCP store only by counting themselves in at "init/"
// as they connect (Note [Rendezvous protocol]); here two TcpStore clients
// with num_workers stand in for them, as PyTorch's clients speak to the
// same server. Rank 0's rendezvous completes on that count, and rank 0 has
// counted itself in: three of three.
TEST(RendezvousThreadsTest, TcpCompletesWithRanksThatOnlyCountInAtInit) {
  const int port = FreePort();
  std::optional<absl::StatusOr<RendezvousResult>> zero;
  std::thread rank_zero([&] {
    zero = rendezvous({.init_method = absl::StrCat("tcp://127.0.0.1:", port),
                       .world_size = 3,
                       .rank = 0,
                       .timeout = absl::Seconds(30)});
  });
  std::vector<std::unique_ptr<TcpStore>> others;
  for (int r = 1; r < 3; ++r) {
    absl::StatusOr<std::unique_ptr<TcpStore>> client = absl::UnavailableError("not connected");
    for (const absl::Time until = absl::Now() + absl::Seconds(30);
         !client.ok() && absl::Now() < until;) {
      client = TcpStore::create({.port = port, .timeout = absl::Seconds(1), .num_workers = 3});
      if (!client.ok()) absl::SleepFor(absl::Milliseconds(20));
    }
    ASSERT_TRUE(client.ok()) << client.status();
    others.push_back(*std::move(client));
  }
  rank_zero.join();
  ASSERT_TRUE(zero.has_value());
  ASSERT_TRUE(zero->ok()) << zero->status();
  EXPECT_EQ((*zero)->rank, 0);
  EXPECT_EQ(others[0]->add_to_worker_count(0).value(), 3);
  // Ember's own join count saw rank 0 alone.
  EXPECT_EQ(others[0]->get("rendezvous/joined", absl::ZeroDuration()).value(), "1");
}

TEST(RendezvousThreadsTest, TcpQueryFields) {
  const std::string url = absl::StrCat("tcp://localhost:", FreePort(), "?world_size=2");
  auto results = RunThreads(2, [&](int r) {
    return RendezvousOptions{.init_method = absl::StrCat(url, "&rank=", r),
                             .timeout = absl::Seconds(20)};
  });
  ExpectOneJob(results);
}

TEST(RendezvousThreadsTest, File) {
  const std::string url = "file://" + TempPath("rdzv");
  auto results = RunThreads(3, [&](int r) {
    return RendezvousOptions{
        .init_method = url, .world_size = 3, .rank = r, .timeout = absl::Seconds(20)};
  });
  ExpectOneJob(results);
}

TEST(RendezvousThreadsTest, FileQueryFields) {
  const std::string url = "file://" + TempPath("query") + "?world_size=2";
  auto results = RunThreads(2, [&](int r) {
    return RendezvousOptions{.init_method = absl::StrCat(url, "&rank=", r),
                             .timeout = absl::Seconds(20)};
  });
  ExpectOneJob(results);
}

// file:// without a rank (the seed's own example): ranks by arrival; every
// rank 0..N-1 is taken once and all share one store.
TEST(RendezvousThreadsTest, FileWithoutRanksAssignsThemByArrival) {
  const std::string url = "file://" + TempPath("arrival");
  auto results = RunThreads(8, [&](int) {
    return RendezvousOptions{.init_method = url, .world_size = 8, .timeout = absl::Seconds(20)};
  });
  ExpectOneJob(results);
}

// Arrival order is the order of the store's atomic add: a process that
// arrives alone, well before the others, is rank 0.
TEST(RendezvousThreadsTest, FileFirstArrivalIsRankZero) {
  const std::string url = "file://" + TempPath("first");
  absl::StatusOr<RendezvousResult> first = absl::UnknownError("not run");
  std::thread early([&] {
    first = rendezvous({.init_method = url, .world_size = 3, .timeout = absl::Seconds(20)});
  });
  // The early process's arrival is visible in the file before the others start.
  absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (true) {
    std::string text;
    if (FILE* f = fopen(url.substr(7).c_str(), "rb")) {
      char buffer[4096];
      size_t n;
      while ((n = fread(buffer, 1, sizeof(buffer), f)) > 0) text.append(buffer, n);
      fclose(f);
    }
    if (absl::StrContains(text, "rendezvous/arrivals") || absl::Now() > deadline) break;
    absl::SleepFor(absl::Milliseconds(5));
  }
  auto late = RunThreads(2, [&](int) {
    return RendezvousOptions{.init_method = url, .world_size = 3, .timeout = absl::Seconds(20)};
  });
  early.join();
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->rank, 0);
  std::set<int> late_ranks;
  for (auto& r : late) {
    ASSERT_TRUE(r.ok()) << r.status();
    late_ranks.insert(r->rank);
  }
  EXPECT_EQ(late_ranks, (std::set<int>{1, 2}));
}

TEST(RendezvousErrorsTest, FileMoreProcessesThanWorldSizeAreRefused) {
  const std::string url = "file://" + TempPath("crowd");
  // Five processes for a job of three: three form the job, two are refused
  // at once (not at the timeout).
  absl::Time start = absl::Now();
  auto results = RunThreads(5, [&](int) {
    return RendezvousOptions{.init_method = url, .world_size = 3, .timeout = absl::Seconds(20)};
  });
  int joined = 0, refused = 0;
  std::set<int> ranks;
  for (auto& r : results) {
    if (r.ok()) {
      ++joined;
      ranks.insert(r->rank);
      continue;
    }
    ++refused;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr("but world_size is 3"));
    EXPECT_THAT(std::string(r.status().message()),
                ::testing::ContainsRegex("arrived as number [45],"));
    EXPECT_THAT(r.status().message(), HasSubstr(url.substr(7)));
  }
  EXPECT_EQ(joined, 3);
  EXPECT_EQ(refused, 2);
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2}));
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));
}

TEST(RendezvousErrorsTest, FileMixingGivenAndAssignedRanksIsRefused) {
  const std::string url = "file://" + TempPath("mixed");
  auto results = RunThreads(2, [&](int i) {
    return RendezvousOptions{.init_method = url,
                             .world_size = 2,
                             .rank = i == 0 ? 1 : -1,
                             .timeout = absl::Milliseconds(1500)};
  });
  int mixed = 0;
  for (auto& r : results) {
    EXPECT_FALSE(r.ok());
    if (absl::StrContains(r.status().message(), "give every process of the job its rank, or none")) {
      EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
      ++mixed;
    }
  }
  // The second to arrive is refused; the first waits for a partner until
  // its timeout.
  EXPECT_EQ(mixed, 1);
}

TEST(RendezvousThreadsTest, FileGroupNamesKeepJobsApart) {
  const std::string url = "file://" + TempPath("shared");
  auto results = RunThreads(4, [&](int i) {
    return RendezvousOptions{.init_method = url,
                             .world_size = 2,
                             .rank = i % 2,
                             .group_name = i < 2 ? "jobA" : "jobB",
                             .timeout = absl::Seconds(20)};
  });
  for (auto& r : results) ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(results[0]->store->set("owner", "A").ok());
  ASSERT_TRUE(results[2]->store->set("owner", "B").ok());
  EXPECT_EQ(results[1]->store->get("owner", absl::Seconds(1)).value(), "A");
  EXPECT_EQ(results[3]->store->get("owner", absl::Seconds(1)).value(), "B");
}

TEST(RendezvousThreadsTest, EnvWithRanksFromOptions) {
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", std::to_string(FreePort()).c_str(), 1);
  setenv("WORLD_SIZE", "2", 1);
  unsetenv("RANK");
  auto results = RunThreads(2, [&](int r) {
    return RendezvousOptions{.init_method = "env://", .rank = r, .timeout = absl::Seconds(20)};
  });
  ExpectOneJob(results);
  unsetenv("MASTER_ADDR");
  unsetenv("MASTER_PORT");
  unsetenv("WORLD_SIZE");
}

// torch documents MASTER_ADDR as required "except for rank 0": rank 0 serves
// the store on MASTER_PORT and needs no address for it. Here rank 1 finds it
// at the same port through tcp://.
TEST(RendezvousThreadsTest, EnvRankZeroNeedsNoMasterAddr) {
  unsetenv("MASTER_ADDR");
  unsetenv("RANK");
  const int port = FreePort();
  setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  setenv("WORLD_SIZE", "2", 1);
  auto results = RunThreads(2, [&](int r) {
    return RendezvousOptions{
        .init_method = r == 0 ? "env://" : "tcp://127.0.0.1:" + std::to_string(port),
        .world_size = 2,
        .rank = r,
        .timeout = absl::Seconds(20)};
  });
  ExpectOneJob(results);
  // Any other rank still needs it.
  setenv("RANK", "1", 1);
  absl::StatusOr<RendezvousResult> other =
      rendezvous({.init_method = "env://", .timeout = absl::Seconds(1)});
  EXPECT_EQ(other.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(other.status().message(),
              HasSubstr("MASTER_ADDR is not set (the address of rank 0; only rank 0 may leave "
                        "it unset)"));
  for (const char* name : {"MASTER_PORT", "WORLD_SIZE", "RANK"}) unsetenv(name);
}

TEST(RendezvousThreadsTest, MulticastAssignsRanksAndGroupNamesShareTheAddress) {
  const std::string url = MulticastUrl();
  auto results = RunThreads(5, [&](int i) {
    // Job A has 3 ranks, job B 2; they share the address.
    bool a = i < 3;
    return RendezvousOptions{.init_method = url,
                             .world_size = a ? 3 : 2,
                             .group_name = a ? "A" : "B",
                             .timeout = absl::Seconds(20)};
  });
  if (MulticastUnavailable(results[0].status())) GTEST_SKIP() << results[0].status();
  std::vector<absl::StatusOr<RendezvousResult>> job_a(results.begin(), results.begin() + 3);
  std::vector<absl::StatusOr<RendezvousResult>> job_b(results.begin() + 3, results.end());
  ExpectOneJob(job_a);
  ExpectOneJob(job_b);
}

TEST(RendezvousThreadsTest, Ipv6MulticastAssignsRanks) {
  const std::string url = Ipv6MulticastUrl();
  auto results = RunThreads(3, [&](int) {
    return RendezvousOptions{.init_method = url, .world_size = 3, .timeout = absl::Seconds(20)};
  });
  if (MulticastUnavailable(results[0].status())) GTEST_SKIP() << results[0].status();
  ExpectOneJob(results);
}

TEST(RendezvousErrorsTest, MulticastProcessesDisagreeingOnWorldSize) {
  const std::string url = MulticastUrl();
  auto results = RunThreads(2, [&](int i) {
    return RendezvousOptions{.init_method = url, .world_size = 2 + i, .timeout = absl::Seconds(3)};
  });
  if (MulticastUnavailable(results[0].status())) GTEST_SKIP() << results[0].status();
  for (auto& result : results) {
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(result.status().message(),
                HasSubstr("use one world_size, or a different group_name per job"));
  }
}

TEST(RendezvousErrorsTest, BadUrlsNameTheProblem) {
  struct Case {
    std::string url;
    std::string expected;
  };
  std::vector<Case> cases = {
      {"foo://x", "unknown scheme 'foo'"},
      {"127.0.0.1:29500", "not a URL"},
      {"tcp://10.0.0.1", "expected tcp://host:port"},
      {"tcp://:29500", "expected tcp://host:port"},
      {"tcp://10.0.0.1:99999", "port=99999"},
      {"tcp://10.0.0.1:http", "port='http'"},
      {"tcp://10.0.0.1:29500?colour=red", "unknown query field 'colour'"},
      {"tcp://10.0.0.1:29500?rank=x", "rank='x'"},
      {"file://", "the path is empty"},
      {"env://somewhere", "env:// takes nothing"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<RendezvousResult> result =
        rendezvous({.init_method = c.url, .world_size = 2, .rank = 0, .timeout = absl::Seconds(1)});
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << c.url;
    EXPECT_THAT(result.status().message(), HasSubstr(c.expected)) << c.url;
    EXPECT_THAT(result.status().message(), HasSubstr(c.url)) << c.url;
  }
}

TEST(RendezvousErrorsTest, WorldSizeAndRankAreCheckedBeforeAnyIo) {
  // 192.0.2.1 (TEST-NET-1) never answers: only a check before I/O is fast.
  absl::Time start = absl::Now();
  auto zero = rendezvous({.init_method = "tcp://192.0.2.1:29500", .world_size = 0, .rank = 0});
  EXPECT_EQ(zero.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(zero.status().message(), HasSubstr("world_size=0"));
  auto too_big = rendezvous({.init_method = "tcp://192.0.2.1:29500", .world_size = 4, .rank = 4});
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(too_big.status().message(), HasSubstr("rank=4 is not in [0, world_size=4)"));
  auto missing_rank = rendezvous({.init_method = "tcp://192.0.2.1:29500", .world_size = 4});
  EXPECT_THAT(missing_rank.status().message(), HasSubstr("the rank is missing"));
  auto missing_world = rendezvous({.init_method = "file:///tmp/x", .rank = 0});
  EXPECT_THAT(missing_world.status().message(), HasSubstr("world size is missing"));
  auto file_rank = rendezvous({.init_method = "file:///tmp/x", .world_size = 2, .rank = 2});
  EXPECT_THAT(file_rank.status().message(), HasSubstr("rank=2 is not in [0, world_size=2)"));
  auto contradiction =
      rendezvous({.init_method = "tcp://192.0.2.1:29500?world_size=3", .world_size = 2, .rank = 0});
  EXPECT_THAT(contradiction.status().message(), HasSubstr("world_size=3 contradicts world_size=2"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
}

// Negative and out-of-range numbers and repeated query fields are refused,
// naming the value, before any I/O.
TEST(RendezvousErrorsTest, NegativeValuesAndRepeatedFieldsNameTheValue) {
  struct Case {
    RendezvousOptions options;
    std::string expected;
  };
  const std::string tcp = "tcp://192.0.2.1:29500";  // TEST-NET-1: never answers
  std::vector<Case> cases = {
      {{.init_method = tcp + "?rank=-5&world_size=4"}, "rank=-5 is not in [0, world_size=4)"},
      {{.init_method = tcp + "?rank=-1&world_size=4"}, "rank=-1 is not in [0, world_size=4)"},
      {{.init_method = "file:///tmp/x?rank=-5&world_size=4"},
       "rank=-5 is not in [0, world_size=4)"},
      {{.init_method = tcp, .world_size = 4, .rank = -5}, "rank=-5 is not in [0, world_size=4)"},
      {{.init_method = tcp + "?rank=0&world_size=-3"},
       "world_size=-3: the world size must be at least 1"},
      {{.init_method = tcp + "?rank=0", .world_size = -2},
       "world_size=-2: the world size must be at least 1"},
      {{.init_method = tcp + "?rank=0&rank=1&world_size=4"},
       "query field 'rank' is given twice (rank=0, then rank=1); give it once"},
      {{.init_method = tcp + "?rank=0&rank=0&world_size=4"}, "query field 'rank' is given twice"},
      {{.init_method = tcp + "?world_size=4&rank=0&world_size=2"},
       "query field 'world_size' is given twice (world_size=4, then world_size=2)"},
      {{.init_method = tcp + "?rank=0&world_size=99999999999"},
       "world_size=99999999999 is out of range"},
      {{.init_method = "tcp://192.0.2.1:-1?rank=0&world_size=1"},
       "port=-1 is not a port in [1, 65535]"},
  };
  absl::Time start = absl::Now();
  for (const Case& c : cases) {
    RendezvousOptions options = c.options;
    options.timeout = absl::Seconds(1);
    absl::StatusOr<RendezvousResult> result = rendezvous(options);
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << c.options.init_method;
    EXPECT_THAT(result.status().message(), HasSubstr(c.expected)) << c.options.init_method;
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));

  // The same from the environment (env://).
  setenv("MASTER_ADDR", "192.0.2.1", 1);
  setenv("MASTER_PORT", "29500", 1);
  setenv("WORLD_SIZE", "4", 1);
  setenv("RANK", "-5", 1);
  auto message = [](RendezvousOptions options) {
    options.timeout = absl::Seconds(1);
    absl::StatusOr<RendezvousResult> result = rendezvous(options);
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(result.status().message());
  };
  EXPECT_THAT(message({}), HasSubstr("RANK=-5 is not in [0, WORLD_SIZE=4)"));
  setenv("RANK", "-1", 1);
  EXPECT_THAT(message({}), HasSubstr("RANK=-1 is not in [0, WORLD_SIZE=4)"));
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "-2", 1);
  EXPECT_THAT(message({}), HasSubstr("WORLD_SIZE=-2: the world size must be at least 1"));
  setenv("WORLD_SIZE", "4", 1);
  setenv("MASTER_PORT", "-29500", 1);
  EXPECT_THAT(message({}), HasSubstr("MASTER_PORT=-29500 is not a port in [1, 65535]"));
  setenv("MASTER_PORT", "29500", 1);
  EXPECT_THAT(message({.init_method = "env://?rank=1&rank=2"}),
              HasSubstr("query field 'rank' is given twice"));
  for (const char* name : {"MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK"}) unsetenv(name);
}

TEST(RendezvousErrorsTest, EnvNamesMissingAndContradictoryVariables) {
  unsetenv("MASTER_ADDR");
  unsetenv("MASTER_PORT");
  unsetenv("WORLD_SIZE");
  unsetenv("RANK");
  auto message = [](RendezvousOptions options) {
    options.timeout = absl::Seconds(1);
    absl::StatusOr<RendezvousResult> result = rendezvous(options);
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(result.status().message());
  };
  EXPECT_THAT(message({}), HasSubstr("MASTER_ADDR is not set"));
  setenv("MASTER_ADDR", "192.0.2.1", 1);
  EXPECT_THAT(message({}), HasSubstr("MASTER_PORT is not set"));
  setenv("MASTER_PORT", "29500x", 1);
  setenv("WORLD_SIZE", "2", 1);
  setenv("RANK", "0", 1);
  EXPECT_THAT(message({}), HasSubstr("MASTER_PORT='29500x'"));
  setenv("MASTER_PORT", "29500", 1);
  unsetenv("WORLD_SIZE");
  EXPECT_THAT(message({}), HasSubstr("WORLD_SIZE is not set"));
  setenv("WORLD_SIZE", "0", 1);
  EXPECT_THAT(message({}), HasSubstr("WORLD_SIZE=0"));
  setenv("WORLD_SIZE", "2", 1);
  unsetenv("RANK");
  EXPECT_THAT(message({}), HasSubstr("RANK is not set"));
  setenv("RANK", "2", 1);
  EXPECT_THAT(message({}), HasSubstr("RANK=2 is not in [0, WORLD_SIZE=2)"));
  setenv("RANK", "1", 1);
  EXPECT_THAT(message({.rank = 0}), HasSubstr("RANK=1 contradicts rank=0"));
  EXPECT_THAT(message({.world_size = 3}), HasSubstr("WORLD_SIZE=2 contradicts world_size=3"));
  EXPECT_THAT(message({.init_method = "env://?rank=0"}), HasSubstr("RANK=1 contradicts rank=0"));
  for (const char* name : {"MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK"}) unsetenv(name);
}

TEST(RendezvousErrorsTest, PortInUseNamesThePort) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  int port = ntohs(addr.sin_port);
  auto result = rendezvous({.init_method = absl::StrCat("tcp://127.0.0.1:", port),
                            .world_size = 2,
                            .rank = 0,
                            .timeout = absl::Seconds(2)});
  close(fd);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(result.status().message(),
              HasSubstr(absl::StrCat("port ", port, " is already in use")));
}

TEST(RendezvousErrorsTest, MissingRanksAreCountedAtTheTimeout) {
  const std::string url = absl::StrCat("tcp://127.0.0.1:", FreePort());
  auto results = RunThreads(2, [&](int r) {
    return RendezvousOptions{
        .init_method = url, .world_size = 4, .rank = r, .timeout = absl::Milliseconds(700)};
  });
  for (auto& result : results) {
    EXPECT_EQ(result.status().code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_THAT(result.status().message(), HasSubstr("2 of 4 ranks joined"));
    EXPECT_THAT(result.status().message(), HasSubstr("missing ranks: 2, 3"));
  }
}

TEST(RendezvousErrorsTest, SameRankTwiceAndDisagreeingWorldSizes) {
  const std::string url = "file://" + TempPath("twice");
  auto results = RunThreads(2, [&](int) {
    return RendezvousOptions{
        .init_method = url, .world_size = 3, .rank = 1, .timeout = absl::Milliseconds(500)};
  });
  int twice = 0;
  for (auto& result : results)
    twice += absl::StrContains(result.status().message(), "rank 1 joined twice");
  EXPECT_EQ(twice, 1);

  const std::string url2 = "file://" + TempPath("sizes");
  auto sizes = RunThreads(2, [&](int r) {
    return RendezvousOptions{
        .init_method = url2, .world_size = 2 + r, .rank = r, .timeout = absl::Milliseconds(500)};
  });
  int disagree = 0;
  for (auto& result : sizes)
    disagree +=
        absl::StrContains(result.status().message(), "but another rank joined with world_size");
  EXPECT_EQ(disagree, 1);
}

// Ranks as processes: this binary re-run with RDZV_CHILD_INIT set.
TEST(RendezvousChildTest, Rank) {
  const char* init = std::getenv("RDZV_CHILD_INIT");
  if (init == nullptr) GTEST_SKIP() << "runs only as a rank of RendezvousProcessesTest";
  RendezvousOptions options{.init_method = init, .timeout = absl::Seconds(30)};
  if (const char* ws = std::getenv("RDZV_CHILD_WORLD_SIZE")) options.world_size = std::atoi(ws);
  if (const char* r = std::getenv("RDZV_CHILD_RANK")) options.rank = std::atoi(r);
  absl::StatusOr<RendezvousResult> result = rendezvous(options);
  if (MulticastUnavailable(result.status())) GTEST_SKIP() << result.status();
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_TRUE(
      result->store->set(absl::StrCat("pid/", result->rank), std::to_string(getpid())).ok());
  std::vector<std::string> keys;
  for (int r = 0; r < result->world_size; ++r) keys.push_back(absl::StrCat("pid/", r));
  ASSERT_TRUE(result->store->wait(keys, absl::Seconds(20)).ok());
  // Rank 0 serves the store: it leaves last.
  ASSERT_TRUE(result->store->add("left", 1).ok());
  if (result->rank == 0) {
    absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (result->store->add("left", 0).value_or(0) < result->world_size &&
           absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(10));
    }
  }
}

// Runs `world_size` copies of this binary as ranks with extra environment.
void RunProcesses(int world_size, std::function<std::vector<std::string>(int)> env_for_rank) {
  std::vector<pid_t> children;
  for (int r = 0; r < world_size; ++r) {
    std::vector<std::string> env = env_for_rank(r);
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      // The child is a test run of its own: keep it off this run's outputs.
      for (const char* name : {"XML_OUTPUT_FILE", "TEST_PREMATURE_EXIT_FILE", "GTEST_OUTPUT"})
        unsetenv(name);
      for (const std::string& kv : env) putenv(strdup(kv.c_str()));
      execl("/proc/self/exe", "rendezvous_test", "--gtest_filter=RendezvousChildTest.Rank",
            nullptr);
      _exit(127);
    }
    children.push_back(pid);
  }
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "rank process status " << status;
  }
}

TEST(RendezvousProcessesTest, Env) {
  int port = FreePort();
  RunProcesses(3, [&](int r) {
    return std::vector<std::string>{"RDZV_CHILD_INIT=env://", "MASTER_ADDR=127.0.0.1",
                                    absl::StrCat("MASTER_PORT=", port), "WORLD_SIZE=3",
                                    absl::StrCat("RANK=", r)};
  });
}

TEST(RendezvousProcessesTest, Tcp) {
  std::string url = absl::StrCat("tcp://127.0.0.1:", FreePort());
  RunProcesses(3, [&](int r) {
    return std::vector<std::string>{"RDZV_CHILD_INIT=" + url, "RDZV_CHILD_WORLD_SIZE=3",
                                    absl::StrCat("RDZV_CHILD_RANK=", r)};
  });
}

TEST(RendezvousProcessesTest, File) {
  std::string url = "file://" + TempPath("processes");
  RunProcesses(3, [&](int r) {
    return std::vector<std::string>{"RDZV_CHILD_INIT=" + url, "RDZV_CHILD_WORLD_SIZE=3",
                                    absl::StrCat("RDZV_CHILD_RANK=", r)};
  });
}

// Processes ranked by arrival: the store's add serialises them across
// processes, so each rank is taken once (RendezvousChildTest checks a
// complete job: every rank's key is set).
TEST(RendezvousProcessesTest, FileWithoutRanks) {
  std::string url = "file://" + TempPath("arrival_processes");
  RunProcesses(4, [&](int) {
    return std::vector<std::string>{"RDZV_CHILD_INIT=" + url, "RDZV_CHILD_WORLD_SIZE=4"};
  });
}

TEST(RendezvousProcessesTest, Multicast) {
  std::string url = MulticastUrl();
  absl::StatusOr<RendezvousResult> alone = rendezvous(
      {.init_method = url, .world_size = 1, .group_name = "probe", .timeout = absl::Seconds(5)});
  if (MulticastUnavailable(alone.status())) GTEST_SKIP() << alone.status();
  ASSERT_TRUE(alone.ok()) << alone.status();
  RunProcesses(3, [&](int) {
    return std::vector<std::string>{"RDZV_CHILD_INIT=" + url, "RDZV_CHILD_WORLD_SIZE=3"};
  });
}

}  // namespace
}  // namespace ember::distributed
