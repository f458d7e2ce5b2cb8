// SHA-256 digests (OpenSSL's libcrypto), as lowercase hex.
//
//   ```cpp
//   #include "hub/sha256.h"
//   std::string abc = ember::hub::sha256_hex("abc");  // "ba7816bf..."
//   EMBER_ASSIGN_OR_RETURN(std::string hex, ember::hub::sha256_of_file("/dev/null"));
//   if (hex != ember::hub::sha256_hex("")) return absl::InternalError("digests differ");
//   ```
//
// Thread-safety: safe from any thread.
#ifndef EMBER_HUB_SHA256_H_
#define EMBER_HUB_SHA256_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ember::hub {

// The digest of `bytes`: 64 lowercase hex digits.
std::string sha256_hex(absl::string_view bytes);

// The digest of the file at `path`, read in chunks. Errors: NotFound /
// Internal naming the path.
absl::StatusOr<std::string> sha256_of_file(const std::string& path);

}  // namespace ember::hub

#endif  // EMBER_HUB_SHA256_H_
