#include "hub/download.h"

#include <curl/curl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>

#include "absl/random/random.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "hub/sha256.h"
#include "serialization/printable.h"

// Note [Download safety]
// ~~~~~~~~~~~~~~~~~~~~~~
// - TLS: peer and host verification are always on; the only knob is which CA
//   bundle to trust (DownloadOptions::ca_bundle / EMBER_HUB_CA_BUNDLE).
// - Redirects are followed (GitHub redirects archive links to
//   codeload.github.com) but only to https: a redirect from https to plain
//   http would let anyone on the path substitute the file, so it is refused.
//   A plain-http URL given explicitly by the caller is allowed.
// - Every attempt has a connect timeout, a stall timeout and a total timeout,
//   so no download hangs. Transient failures are retried with exponential
//   backoff; client errors (4xx), TLS verification failures and refused
//   redirects are not, since repeating them cannot help.
// - Bytes go to "<dest>.partial-<random>" in the destination's directory (same
//   file system, so the final rename is atomic). The hash is checked on that
//   file; only a verified file is renamed over `dest`.

namespace ember::hub {

using ::ember::serialization::escape_for_terminal;

namespace {

struct CurlDeleter {
  void operator()(CURL* c) const { curl_easy_cleanup(c); }
};
struct FileCloser {
  void operator()(FILE* f) const { std::fclose(f); }
};

void GlobalInitOnce() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

// Note [Progress bar]
// ~~~~~~~~~~~~~~~~~~~
// Drawn on stderr only when DownloadOptions::progress is set and stderr is a
// terminal; there is no size or duration threshold (PyTorch's tqdm bar shows
// for every download too). One line, "<file>: NN%|####   | x.x/y.y MB" (kB
// under a megabyte), is rewritten in place with '\r' at most every 100 ms,
// and once more at 100%; a newline ends it. Only a 2xx response's body counts (a redirect or error
// page draws nothing), and an attempt that drew nothing prints nothing.
struct Progress {
  bool enabled = false;
  CURL* curl = nullptr;
  std::string name;
  bool drawn = false;
  curl_off_t last_bytes = -1;
  absl::Time last_time = absl::InfinitePast();
};

void Draw(Progress& p, curl_off_t total, curl_off_t now) {
  // kB below a megabyte, so that a small file shows a size rather than 0.0.
  const bool mb = std::max(total, now) >= 1000000;
  const double unit = mb ? 1e6 : 1e3;
  const char* unit_name = mb ? "MB" : "kB";
  if (total > 0) {
    int pct = static_cast<int>(100 * now / total);
    std::fprintf(stderr, "\r%s: %3d%%|%-25s| %.1f/%.1f %s", p.name.c_str(), pct,
                 std::string(pct / 4, '#').c_str(), now / unit, total / unit, unit_name);
  } else {
    std::fprintf(stderr, "\r%s: %.1f %s", p.name.c_str(), now / unit, unit_name);
  }
  std::fflush(stderr);
  p.drawn = true;
  p.last_bytes = now;
  p.last_time = absl::Now();
}

int OnProgress(void* user, curl_off_t total, curl_off_t now, curl_off_t, curl_off_t) {
  auto* p = static_cast<Progress*>(user);
  if (!p->enabled || now == p->last_bytes || (now == 0 && total == 0)) return 0;
  long code = 0;
  curl_easy_getinfo(p->curl, CURLINFO_RESPONSE_CODE, &code);
  if (code < 200 || code >= 300) return 0;
  bool done = total > 0 && now >= total;
  if (done || absl::Now() - p->last_time >= absl::Milliseconds(100)) Draw(*p, total, now);
  return 0;
}

// Ends the bar of an attempt: redraws the final count if the last callback
// was throttled away, then the newline.
void FinishProgress(Progress& p, bool ok) {
  if (!p.drawn) return;
  curl_off_t got = 0, total = -1;
  curl_easy_getinfo(p.curl, CURLINFO_SIZE_DOWNLOAD_T, &got);
  curl_easy_getinfo(p.curl, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &total);
  if (ok && got != p.last_bytes) Draw(p, total, got);
  std::fputc('\n', stderr);
  std::fflush(stderr);
}

size_t OnData(char* data, size_t size, size_t n, void* user) {
  return std::fwrite(data, size, n, static_cast<FILE*>(user)) * size;
}

struct Attempt {
  absl::Status status;
  bool retry = false;
};

Attempt TryOnce(const std::string& url, const std::string& tmp, const std::string& name,
                const DownloadOptions& options, const std::string& ca_bundle) {
  std::unique_ptr<FILE, FileCloser> out(std::fopen(tmp.c_str(), "wb"));
  if (!out) {
    return {absl::InternalError(absl::StrCat("cannot write ", tmp, ": ", std::strerror(errno))),
            false};
  }
  std::unique_ptr<CURL, CurlDeleter> curl(curl_easy_init());
  CURL* c = curl.get();
  char error[CURL_ERROR_SIZE] = {0};
  Progress progress;
  progress.enabled = options.progress && isatty(STDERR_FILENO);
  progress.curl = c;
  progress.name = name;
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, error);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(c, CURLOPT_MAXREDIRS, 10L);
  curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "https");
  curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, 1L);
  curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, 2L);
  if (!ca_bundle.empty()) curl_easy_setopt(c, CURLOPT_CAINFO, ca_bundle.c_str());
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(absl::ToInt64Milliseconds(options.connect_timeout)));
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS,
                   static_cast<long>(absl::ToInt64Milliseconds(options.total_timeout)));
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1024L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME,
                   static_cast<long>(absl::ToInt64Seconds(options.stall_timeout)));
  curl_easy_setopt(c, CURLOPT_USERAGENT, "ember-hub/1");
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, OnData);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, out.get());
  curl_easy_setopt(c, CURLOPT_NOPROGRESS, progress.enabled ? 0L : 1L);
  curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, OnProgress);
  curl_easy_setopt(c, CURLOPT_XFERINFODATA, &progress);

  CURLcode rc = curl_easy_perform(c);
  FinishProgress(progress, rc == CURLE_OK);
  bool flushed = std::fflush(out.get()) == 0;
  std::string what = absl::StrCat("downloading ", url, ": ");
  long redirects = 0;
  curl_easy_getinfo(c, CURLINFO_REDIRECT_COUNT, &redirects);
  char* redirect_url = nullptr;
  curl_easy_getinfo(c, CURLINFO_REDIRECT_URL, &redirect_url);
  if (rc == CURLE_UNSUPPORTED_PROTOCOL && redirects == 0 && redirect_url == nullptr) {
    return {absl::InvalidArgumentError(
                absl::StrCat(what, "unsupported protocol (", error, "); use an https:// URL")),
            false};
  }
  if (rc == CURLE_UNSUPPORTED_PROTOCOL) {
    return {
        absl::PermissionDeniedError(absl::StrCat(what, "refused a redirect to a non-https URL (",
                                                 error, "); only https redirects are followed")),
        false};
  }
  if (rc == CURLE_PEER_FAILED_VERIFICATION || rc == CURLE_SSL_CACERT_BADFILE) {
    return {absl::UnavailableError(absl::StrCat(what, "TLS verification failed: ", error, " (set ",
                                                kCaBundleEnv,
                                                " to a PEM bundle that trusts this server)")),
            false};
  }
  if (rc != CURLE_OK) {
    bool transient = rc == CURLE_COULDNT_CONNECT || rc == CURLE_OPERATION_TIMEDOUT ||
                     rc == CURLE_PARTIAL_FILE || rc == CURLE_RECV_ERROR || rc == CURLE_SEND_ERROR ||
                     rc == CURLE_GOT_NOTHING || rc == CURLE_COULDNT_RESOLVE_HOST;
    return {absl::UnavailableError(absl::StrCat(what, curl_easy_strerror(rc), ": ", error)),
            transient};
  }
  long code = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
  if (code == 404) return {absl::NotFoundError(absl::StrCat(what, "HTTP 404 (not found)")), false};
  if (code >= 400) {
    return {absl::UnavailableError(absl::StrCat(what, "HTTP ", code)), code >= 500 || code == 429};
  }
  if (!flushed)
    return {absl::InternalError(absl::StrCat("cannot write ", tmp, ": ", std::strerror(errno))),
            false};
  return {absl::OkStatus(), false};
}

}  // namespace

absl::Status check_url_scheme(absl::string_view url) {
  const size_t colon = url.find("://");
  const std::string scheme =
      colon == absl::string_view::npos ? "" : absl::AsciiStrToLower(url.substr(0, colon));
  if (scheme == "https" || scheme == "http") return absl::OkStatus();
  if (scheme.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("URL '", escape_for_terminal(url), "' has no scheme; give it as https://..."));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unsupported URL scheme '", escape_for_terminal(scheme), "' in ", escape_for_terminal(url),
      ": downloads use https:// (or http:// when given "
      "explicitly)"));
}

absl::Status download_url_to_file(const std::string& url, const std::string& dest,
                                  const DownloadOptions& options) {
  if (absl::Status s = check_url_scheme(url); !s.ok()) return s;
  GlobalInitOnce();
  std::string ca_bundle = options.ca_bundle;
  if (const char* env = std::getenv(kCaBundleEnv); ca_bundle.empty() && env != nullptr)
    ca_bundle = env;
  absl::BitGen gen;
  std::string tmp = absl::StrCat(dest, ".partial-", absl::Uniform<uint64_t>(gen));
  const std::string name = dest.substr(dest.find_last_of('/') + 1);
  Attempt attempt;
  absl::Duration backoff = options.initial_backoff;
  for (int i = 1; i <= std::max(1, options.max_attempts); ++i) {
    attempt = TryOnce(url, tmp, name, options, ca_bundle);
    if (attempt.status.ok() || !attempt.retry || i == options.max_attempts) break;
    absl::SleepFor(backoff);
    backoff *= 2;
  }
  if (!attempt.status.ok()) {
    std::remove(tmp.c_str());
    if (attempt.retry) {
      return absl::Status(attempt.status.code(), absl::StrCat(attempt.status.message(), " (after ",
                                                              options.max_attempts, " attempts)"));
    }
    return attempt.status;
  }
  if (!options.hash_prefix.empty()) {
    absl::StatusOr<std::string> digest = sha256_of_file(tmp);
    if (!digest.ok() || !absl::StartsWith(*digest, options.hash_prefix)) {
      std::remove(tmp.c_str());
      if (!digest.ok()) return digest.status();
      return absl::DataLossError(
          absl::StrCat("invalid hash value for ", url, ": expected the SHA-256 to start with '",
                       options.hash_prefix, "', got '", *digest, "'; the download was discarded"));
    }
  }
  if (std::rename(tmp.c_str(), dest.c_str()) != 0) {
    int err = errno;
    std::remove(tmp.c_str());
    return absl::InternalError(
        absl::StrCat("cannot move download into ", dest, ": ", std::strerror(err)));
  }
  return absl::OkStatus();
}

}  // namespace ember::hub
