// Test helpers for data/ (testonly): JPEG pictures made with libjpeg-turbo's
// encoder, so the decoding tests compare against an independent encoder.
#ifndef EMBER_DATA_TESTING_H_
#define EMBER_DATA_TESTING_H_

#include <array>
#include <functional>
#include <string>

namespace ember::data::testing {

// A w x h picture of f(x, y) = {r, g, b} (each 0-255) as JPEG bytes,
// quality 95; `gray` encodes one channel, from r.
std::string EncodeJpeg(int w, int h, const std::function<std::array<int, 3>(int, int)>& f,
                       bool gray = false);

}  // namespace ember::data::testing

#endif  // EMBER_DATA_TESTING_H_
