#include "hub/sha256.h"

#include <openssl/evp.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace ember::hub {
namespace {

struct MdCtxDeleter {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};
struct FileCloser {
  void operator()(FILE* f) const { std::fclose(f); }
};

std::string Hex(const unsigned char* digest, unsigned int n) {
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest), n));
}

}  // namespace

std::string sha256_hex(absl::string_view bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_Digest(bytes.data(), bytes.size(), digest, &n, EVP_sha256(), nullptr);
  return Hex(digest, n);
}

absl::StatusOr<std::string> sha256_of_file(const std::string& path) {
  std::unique_ptr<FILE, FileCloser> f(std::fopen(path.c_str(), "rb"));
  if (!f) {
    int err = errno;
    std::string msg =
        absl::StrCat("cannot read ", path, ": ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(msg) : absl::InternalError(msg);
  }
  std::unique_ptr<EVP_MD_CTX, MdCtxDeleter> ctx(EVP_MD_CTX_new());
  EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr);
  char buf[1 << 16];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof buf, f.get())) > 0)
    EVP_DigestUpdate(ctx.get(), buf, got);
  if (std::ferror(f.get()))
    return absl::InternalError(absl::StrCat("error reading ", path));
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_DigestFinal_ex(ctx.get(), digest, &n);
  return Hex(digest, n);
}

}  // namespace ember::hub
