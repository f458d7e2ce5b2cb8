// The release artifacts as a user gets them (//tools/release): the tarball
// unpacked into an empty directory and checked against its SHA256SUMS, each
// binary run there with an empty environment (env -i: no runfiles, no
// LD_LIBRARY_PATH) for --version, --help and one real job, the shared
// libraries each still loads, the glibc it needs, tampered and truncated
// archives, and the .deb installed, run and removed in a throwaway root.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "distributed/elastic/lighthouse.h"
#include "distributed/testing/free_port.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hub/testing/test_server.h"
#include "tools/shm_manager/testing.h"

namespace ember::release {
namespace {

using ::ember::multiprocessing::testing::WaitUntil;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::MatchesRegex;
using ::testing::UnorderedElementsAreArray;

// The shared libraries besides glibc the hub binary still loads: those Debian
// ships no static archive for (README.md "Installing the tools"). launch,
// shm_manager and lighthouse load none.
const std::vector<std::string> kHubSharedLibraries = {
    "libacl.so.1",  "libgssapi_krb5.so.2", "liblber-2.5.so.0", "libldap-2.5.so.0",
    "liblz4.so.1",  "libnghttp2.so.14",    "libpsl.so.5",      "librtmp.so.1",
    "libssh2.so.1", "libunistring.so.2",   "libzstd.so.1"};
// The newest glibc symbol version the binaries use (README.md).
constexpr char kGlibc[] = "2.35";

struct Result {
  int code;
  std::string out;
  std::string err;
};

std::string Runfile(const std::string& path) {
  return absl::StrCat(std::getenv("TEST_SRCDIR"), "/", std::getenv("TEST_WORKSPACE"), "/", path);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Runs `command` with /bin/sh in `dir`.
Result Sh(const std::string& command, const std::string& dir = std::getenv("TEST_TMPDIR")) {
  static int counter = 0;
  const std::string base = absl::StrCat(std::getenv("TEST_TMPDIR"), "/sh", counter++);
  const std::string full = absl::StrCat("cd '", dir, "' && { ", command, "; } >", base, ".out 2>",
                                        base, ".err </dev/null");
  int status = std::system(full.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, ReadFile(base + ".out"),
          ReadFile(base + ".err")};
}

std::vector<std::string> Lines(const std::string& text) {
  return absl::StrSplit(text, '\n', absl::SkipEmpty());
}

std::string Version() {
  return std::string(absl::StripAsciiWhitespace(ReadFile(Runfile("VERSION"))));
}

std::string ReleaseDir() { return Runfile("tools/release/release"); }

std::string TarballName() { return "ember-tools-" + Version() + "-linux-x86_64"; }

std::string DebName() { return "ember-tools_" + Version() + "_amd64.deb"; }

// A fresh, empty directory under TEST_TMPDIR.
std::string FreshDir(const std::string& name) {
  std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
  EXPECT_EQ(Sh("rm -rf '" + dir + "' && mkdir -p '" + dir + "'").code, 0);
  return dir;
}

const std::vector<std::string> kTools = {"launch", "shm_manager", "hub", "lighthouse"};

class ReleaseTest : public ::testing::Test {
 protected:
  // The tarball unpacked into an empty directory; `root_` is its top folder.
  static void SetUpTestSuite() {
    std::string dir = FreshDir("unpacked");
    Result r = Sh("tar -xzf '" + ReleaseDir() + "/" + TarballName() + ".tar.gz'", dir);
    ASSERT_EQ(r.code, 0) << r.err;
    root_ = new std::string(dir + "/" + TarballName());
  }
  static void TearDownTestSuite() { delete root_; }

  std::string Bin(const std::string& tool) { return *root_ + "/bin/" + tool; }

  static std::string* root_;
};
std::string* ReleaseTest::root_ = nullptr;

TEST_F(ReleaseTest, ArtifactsMatchTheirChecksums) {
  Result r = Sh("sha256sum -c SHA256SUMS", ReleaseDir());
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr(TarballName() + ".tar.gz: OK"));
  EXPECT_THAT(r.out, HasSubstr(DebName() + ": OK"));
  r = Sh("sha256sum -c SHA256SUMS", *root_);
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  for (std::string file : {"bin/launch", "bin/shm_manager", "bin/hub", "bin/lighthouse", "LICENSE",
                           "THIRD_PARTY_NOTICES", "share/man/man1/hub.1"}) {
    EXPECT_THAT(r.out, HasSubstr(absl::StrCat(file, ": OK")));
  }
}

// The licences of what the binaries contain travel with them: one section per
// Debian package whose static archive was linked in, each with that
// package's copyright file, in the tarball and in the .deb.
TEST_F(ReleaseTest, ThirdPartyNoticesNameEveryLinkedPackage) {
  const std::string notices = ReadFile(*root_ + "/THIRD_PARTY_NOTICES");
  for (std::string package : {"libabsl-dev (", "libgrpc++-dev (", "libprotobuf-dev (",
                              "libcurl4-openssl-dev (", "libarchive-dev (", "libssl-dev ("}) {
    EXPECT_THAT(notices, HasSubstr(package)) << package;
  }
  EXPECT_THAT(notices, HasSubstr("Apache License"));  // Abseil's and gRPC's licence text
  Result r = Sh("dpkg-deb -c '" + ReleaseDir() + "/" + DebName() + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("./usr/share/doc/ember-tools/THIRD_PARTY_NOTICES"));
}

TEST_F(ReleaseTest, EveryToolPrintsVersionAndHelpWithNoEnvironment) {
  for (const std::string& tool : kTools) {
    Result r = Sh("env -i '" + Bin(tool) + "' --version", "/");
    EXPECT_EQ(r.code, 0) << tool << ": " << r.err;
    EXPECT_THAT(r.out, MatchesRegex(tool + " " + Version() + " \\(git [0-9a-z-]+\\)\n"));
    r = Sh("env -i '" + Bin(tool) + "' --help", "/");
    EXPECT_EQ(r.code, 0) << tool << ": " << r.err;
    EXPECT_THAT(r.out, HasSubstr("Exit status: 0"));
    // The man page is that same text.
    std::string page = ReadFile(*root_ + "/share/man/man1/" + tool + ".1");
    EXPECT_THAT(page, HasSubstr(".TH " + std::string(tool == "hub" ? "HUB" : "")));
    EXPECT_THAT(page, HasSubstr(Lines(r.out).back()));
  }
}

TEST_F(ReleaseTest, BinariesLoadOnlyGlibcAndTheDocumentedLibraries) {
  for (const std::string& tool : kTools) {
    Result r = Sh("objdump -p '" + Bin(tool) + "' | awk '$1 == \"NEEDED\" { print $2 }'");
    ASSERT_EQ(r.code, 0) << r.err;
    std::vector<std::string> extra;
    for (const std::string& lib : Lines(r.out)) {
      if (lib != "libc.so.6" && lib != "libm.so.6" && lib != "ld-linux-x86-64.so.2") {
        extra.push_back(lib);
      }
    }
    EXPECT_THAT(extra, UnorderedElementsAreArray(tool == "hub" ? kHubSharedLibraries
                                                               : std::vector<std::string>{}))
        << tool;
    r = Sh("objdump -T '" + Bin(tool) + "' | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1");
    EXPECT_EQ(r.out, absl::StrCat("GLIBC_", kGlibc, "\n")) << tool;
  }
  // ldd agrees: launch, shm_manager and lighthouse resolve nothing outside glibc.
  for (std::string tool : {"launch", "shm_manager", "lighthouse"}) {
    Result r = Sh("env -i ldd '" + Bin(tool) + "' | awk '{ print $1 }'");
    EXPECT_THAT(Lines(r.out),
                UnorderedElementsAreArray<std::string>(
                    {"linux-vdso.so.1", "libm.so.6", "libc.so.6", "/lib64/ld-linux-x86-64.so.2"}))
        << tool;
  }
  // What the tarball documents is what the binaries load.
  std::string listed = ReadFile(*root_ + "/share/doc/ember-tools/SHARED_LIBRARIES");
  for (const std::string& lib : kHubSharedLibraries) EXPECT_THAT(listed, HasSubstr(lib));
  EXPECT_THAT(listed, HasSubstr("launch:\n"));
}

TEST_F(ReleaseTest, LaunchRunsTwoRanksThatRendezvous) {
  std::string out = FreshDir("launch_out");
  Result r =
      Sh(absl::StrCat("env -i '", Bin("launch"),
                      "' --nproc_per_node=2 --master_port=", distributed::testing::FreePort(),
                      " --use_env '", Runfile("tools/launch/launch_test_worker"),
                      "' --mode=rendezvous --out=", out),
         "/");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(ReadFile(out + "/joined0"), "2");
  EXPECT_EQ(ReadFile(out + "/joined1"), "2");
}

// The tarball's lighthouse, started with no environment, decides a quorum of
// two replica groups asking at once and stops cleanly on SIGTERM.
TEST_F(ReleaseTest, LighthouseFormsAQuorumOfTwoGroups) {
  const std::string dir = FreshDir("lighthouse");
  const std::string address = absl::StrCat("127.0.0.1:", distributed::testing::FreePort());
  Result r = Sh(absl::StrCat("env -i '", Bin("lighthouse"), "' --bind=", address,
                             " --min_replicas=2 --join_timeout_ms=10000 >log 2>&1 & echo $!"),
                dir);
  ASSERT_EQ(r.code, 0) << r.err;
  const pid_t pid = std::stoi(r.out);
  ASSERT_TRUE(WaitUntil([&] { return ReadFile(dir + "/log").find("serving on") != std::string::npos; },
                        absl::Seconds(30)))
      << ReadFile(dir + "/log");
  absl::StatusOr<distributed::elastic::Quorum> quorums[2];
  std::vector<std::thread> groups;
  for (int g = 0; g < 2; ++g) {
    groups.emplace_back([&, g] {
      auto client = distributed::elastic::LighthouseClient::create(address);
      if (!client.ok()) {
        quorums[g] = client.status();
        return;
      }
      quorums[g] = (*client)->quorum(
          {.replica_id = absl::StrCat("group", g), .address = absl::StrCat("host", g, ":1"),
           .step = 10 * g},
          absl::Seconds(30));
    });
  }
  for (std::thread& t : groups) t.join();
  for (int g = 0; g < 2; ++g) {
    ASSERT_TRUE(quorums[g].ok()) << g << ": " << quorums[g].status();
    ASSERT_EQ(quorums[g]->members.size(), 2u) << g;
    EXPECT_EQ(quorums[g]->members[0].replica_id, "group0");
    EXPECT_EQ(quorums[g]->members[1].address, "host1:1");
    EXPECT_EQ(quorums[g]->max_step, 10);
  }
  EXPECT_EQ(quorums[0]->quorum_id, quorums[1]->quorum_id);
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  EXPECT_TRUE(WaitUntil([&] { return kill(pid, 0) != 0; }, absl::Seconds(30)));
  EXPECT_THAT(ReadFile(dir + "/log"), HasSubstr("stopping (1 quorums decided)"));
}

TEST_F(ReleaseTest, HubFetchesFromTheTestServer) {
  std::string tmp = FreshDir("hub");
  ASSERT_TRUE(hub::testing::WriteArchive(tmp + "/www/alice/models/zipball/main", "zip",
                                         {{"top/hubconf.textproto",
                                           "entry_points { name: \"tiny\" builder: \"mlp\" "
                                           "doc: \"A tiny MLP.\" }"}})
                  .ok());
  absl::StatusOr<hub::testing::TestServer> server =
      hub::testing::TestServer::Start(tmp + "/www", tmp + "/server");
  ASSERT_TRUE(server.ok()) << server.status();
  std::string env = absl::StrCat("env -i EMBER_HUB_BASE_URL=", server->base_url(),
                                 " EMBER_HUB_CA_BUNDLE=", server->ca_bundle(), " ");
  Result r = Sh(env + "'" + Bin("hub") + "' fetch alice/models --hub-dir " + tmp + "/cache", "/");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr(tmp + "/cache/"));
  r = Sh(env + "'" + Bin("hub") + "' list alice/models --hub-dir " + tmp + "/cache", "/");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "tiny\n");
  // Without a hub directory to use, it says which variables to set.
  r = Sh(env + "'" + Bin("hub") + "' fetch alice/models", "/");
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("no hub directory"));
}

TEST_F(ReleaseTest, ShmManagerStartedByAClientCleansUpAfterIt) {
  std::string tmpdir = FreshDir("shm");
  std::string prefix = absl::StrCat("/embertest_rel_", ::getpid());
  Result r = Sh(absl::StrCat("env -i TMPDIR=", tmpdir, " EMBER_SHM_MANAGER='", Bin("shm_manager"),
                             "' EMBER_SHM_MANAGER_GRACE_MS=200 EMBER_SHM_PREFIX=", prefix, " '",
                             Runfile("tools/release/shm_client"), "'"),
                "/");
  ASSERT_EQ(r.code, 0) << r.err;
  std::vector<std::string> regions = Lines(r.out);
  ASSERT_EQ(regions.size(), 1u) << r.out;
  // The client left without a word: the manager unlinks its region, then
  // exits after the grace period and removes its directory.
  EXPECT_TRUE(WaitUntil([&] { return !shm_manager::testing::PathExists("/dev/shm/" + regions[0]); },
                        absl::Seconds(10)));
  EXPECT_TRUE(
      WaitUntil([&] { return Sh("ls -A '" + tmpdir + "'").out.empty(); }, absl::Seconds(15)))
      << Sh("ls -lA '" + tmpdir + "'").out;
}

TEST_F(ReleaseTest, TruncatedOrTamperedArchivesAreCaught) {
  std::string dir = FreshDir("tampered");
  ASSERT_EQ(Sh("cp '" + ReleaseDir() + "'/* .", dir).code, 0);
  ASSERT_EQ(Sh("chmod u+w ./*", dir).code, 0);
  // Truncated: the archive's checksum no longer matches.
  ASSERT_EQ(Sh("truncate -s 1000000 " + TarballName() + ".tar.gz", dir).code, 0);
  Result r = Sh("sha256sum -c SHA256SUMS", dir);
  EXPECT_NE(r.code, 0);
  EXPECT_THAT(r.out, HasSubstr(TarballName() + ".tar.gz: FAILED"));
  // Tampered after unpacking (or re-packed with a changed binary): the
  // SHA256SUMS inside names the file.
  std::string unpacked = FreshDir("tampered_unpacked");
  ASSERT_EQ(Sh("tar -xzf '" + ReleaseDir() + "/" + TarballName() + ".tar.gz'", unpacked).code, 0);
  ASSERT_EQ(Sh("printf 'x' | dd of=bin/hub bs=1 seek=4096 conv=notrunc status=none",
               unpacked + "/" + TarballName())
                .code,
            0);
  r = Sh("sha256sum -c SHA256SUMS", unpacked + "/" + TarballName());
  EXPECT_NE(r.code, 0);
  EXPECT_THAT(r.out, HasSubstr("bin/hub: FAILED"));
  EXPECT_THAT(r.out, HasSubstr("bin/launch: OK"));
}

TEST_F(ReleaseTest, DebInstallsRunsAndRemovesInAThrowawayRoot) {
  const std::string deb = ReleaseDir() + "/" + DebName();
  // Depends names exactly the packages that own the shared libraries the
  // binaries load (glibc's included), as this machine's dpkg database says.
  Result r = Sh("dpkg-deb -f '" + deb + "' Depends");
  ASSERT_EQ(r.code, 0) << r.err;
  std::set<std::string> depends;
  for (absl::string_view d : absl::StrSplit(absl::StripAsciiWhitespace(r.out), ", ")) {
    depends.insert(std::string(d.substr(0, d.find(' '))));
  }
  r =
      Sh("for b in bin/*; do objdump -p \"$b\" | awk '$1 == \"NEEDED\" { print $2 }'; done | "
         "sort -u | while read -r so; do dpkg -S \"*/$so\" | grep -E '(x86_64-linux-gnu|lib64)/' | "
         "sed -n '1s/:.*//p'; done | sort -u",
         *root_);
  ASSERT_EQ(r.code, 0) << r.err;
  std::vector<std::string> owners;
  for (const std::string& line : Lines(r.out)) {
    owners.push_back(line.substr(0, line.find(':')));
  }
  EXPECT_THAT(depends, UnorderedElementsAreArray(owners));

  // Installed into an empty root whose package database is this machine's,
  // so that dpkg checks the Depends against real packages.
  std::string root = FreshDir("debroot");
  ASSERT_EQ(Sh("mkdir -p var/lib/dpkg/info var/lib/dpkg/updates var/lib/dpkg/triggers && "
               "cp /var/lib/dpkg/status var/lib/dpkg/status && touch var/lib/dpkg/available",
               root)
                .code,
            0);
  // dpkg looks for ldconfig and start-stop-daemon on PATH.
  const std::string dpkg = "PATH=/usr/sbin:/usr/bin:/sbin:/bin dpkg --root='" + root +
                           "' --force-not-root --force-script-chrootless --log=/dev/null ";
  r = Sh(dpkg + "-i '" + deb + "'");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  for (const std::string& tool : kTools) {
    r = Sh("env -i '" + root + "/usr/bin/" + tool + "' --version", "/");
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_THAT(r.out, HasSubstr(tool + " " + Version()));
    EXPECT_TRUE(shm_manager::testing::PathExists(root + "/usr/share/man/man1/" + tool + ".1.gz"));
  }
  r = Sh(dpkg + "-r ember-tools");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_THAT(Sh("find usr -type f", root).out, IsEmpty());
}

}  // namespace
}  // namespace ember::release
