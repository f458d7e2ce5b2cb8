// Proves libcurl links, supports HTTPS, and performs a real transfer (file://,
// so the test needs no network).
#include <curl/curl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "gtest/gtest.h"

namespace {

size_t Append(char* data, size_t size, size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

TEST(CurlTest, SupportsHttpsAndTransfersAFile) {
  curl_version_info_data* info = curl_version_info(CURLVERSION_NOW);
  ASSERT_NE(info, nullptr);
  EXPECT_NE(info->features & CURL_VERSION_SSL, 0) << "libcurl built without TLS";

  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string path = std::string(tmp ? tmp : "/tmp") + "/curl_test.txt";
  FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs("payload", f);
  std::fclose(f);

  CURL* curl = curl_easy_init();
  ASSERT_NE(curl, nullptr);
  std::string body;
  curl_easy_setopt(curl, CURLOPT_URL, ("file://" + path).c_str());
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, Append);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &body);
  CURLcode rc = curl_easy_perform(curl);
  curl_easy_cleanup(curl);
  ASSERT_EQ(rc, CURLE_OK) << curl_easy_strerror(rc);
  EXPECT_EQ(body, "payload");
  unlink(path.c_str());
}

}  // namespace
