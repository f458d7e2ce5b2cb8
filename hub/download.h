// Downloading a URL into a file with libcurl, the way torch.hub's
// download_url_to_file does: to a temporary file beside the destination,
// verified, then renamed, so that an interrupted or corrupt download never
// leaves a half-written file under the destination's name.
//
//   ```cpp compile-only
//   #include "hub/download.h"
//   ember::hub::DownloadOptions opts;
//   opts.hash_prefix = "a1b2c3d4";
//   EMBER_RETURN_IF_ERROR(ember::hub::download_url_to_file(
//       "https://example.org/resnet18-a1b2c3d4.pt",
//       "/data/hub/checkpoints/resnet18-a1b2c3d4.pt", opts));
//   ```
//
// See Note [Download safety] in download.cc for timeouts, retries, TLS and
// redirects.
//
// Thread-safety: safe to call from several threads (each call owns its curl
// handle). It does not lock the destination; callers that may race on one
// destination hold a FileLock (file_lock.h).
#ifndef EMBER_HUB_DOWNLOAD_H_
#define EMBER_HUB_DOWNLOAD_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace ember::hub {

// Environment variable naming a PEM file of CA certificates to trust instead of
// the system's (for private mirrors, and for tests).
inline constexpr char kCaBundleEnv[] = "EMBER_HUB_CA_BUNDLE";

struct DownloadOptions {
  // Time allowed to establish the connection (per attempt).
  absl::Duration connect_timeout = absl::Seconds(30);
  // A transfer slower than 1 KiB/s for this long is aborted (per attempt).
  absl::Duration stall_timeout = absl::Seconds(60);
  // Upper bound for one attempt, whatever the speed.
  absl::Duration total_timeout = absl::Minutes(30);
  // Attempts for transient failures (connection errors, timeouts, cut
  // transfers, HTTP 5xx/429), with `initial_backoff` doubling between them.
  int max_attempts = 3;
  absl::Duration initial_backoff = absl::Milliseconds(500);
  // A one-line progress bar on stderr (the destination's file name, percent,
  // MB), drawn only when stderr is a terminal, for downloads of any size
  // (Note [Progress bar] in download.cc).
  bool progress = true;
  // PEM bundle of trusted CAs; empty: $EMBER_HUB_CA_BUNDLE, else the system's.
  std::string ca_bundle;
  // When non-empty, the file's SHA-256 (hex) must start with it.
  std::string hash_prefix;
};

// OK when `url` is one DownloadUrlToFile accepts: an https:// or http://
// URL (the scheme in any case). Errors: InvalidArgument naming the scheme
// (ftp, file ...) or saying the URL has none.
absl::Status check_url_scheme(absl::string_view url);

// Downloads `url` to `dest` (whose directory must exist), replacing any file
// there only once the new one is complete and verified. Blocks for at most
// about max_attempts * total_timeout. Errors: InvalidArgument for a URL
// check_url_scheme refuses; NotFound for HTTP 404; PermissionDenied for a
// redirect to anything but https; Unavailable for network and
// TLS failures after the retries; DataLoss when the hash does not match (the
// message gives expected and actual); Internal for local file errors. On any
// error `dest` is untouched and no temporary file is left.
absl::Status download_url_to_file(const std::string& url, const std::string& dest,
                                  const DownloadOptions& options = {});

}  // namespace ember::hub

#endif  // EMBER_HUB_DOWNLOAD_H_
