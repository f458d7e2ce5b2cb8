// Warnings of the parallel area, as Python's warnings.warn with its default
// filter: "UserWarning: <message>" on stderr, each distinct message once per
// process. Thread-safe.
#ifndef EMBER_PARALLEL_WARNING_H_
#define EMBER_PARALLEL_WARNING_H_

#include <string_view>

namespace ember::parallel::internal {

void Warn(std::string_view message);

}  // namespace ember::parallel::internal

#endif  // EMBER_PARALLEL_WARNING_H_
