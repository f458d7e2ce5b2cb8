// Text from repositories and checkpoints made safe to print: hub names, docs
// and file contents are chosen by whoever publishes them, and a terminal
// obeys escape sequences, carriage returns and bidirectional overrides in
// what it is sent.
//
//   ```cpp
//   #include <iostream>
//   #include "serialization/printable.h"
//   std::string doc = "ResNet-18.\n\x1b[2J";  // as published: ends by clearing the screen
//   // Shown as text, the escape sequence made visible:
//   std::cout << ember::serialization::escape_for_terminal(doc, /*keep_newlines=*/true);
//   ```
//
// Thread-safety: free functions; safe from any thread.
#ifndef EMBER_SERIALIZATION_PRINTABLE_H_
#define EMBER_SERIALIZATION_PRINTABLE_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace ember::serialization {

// `text` with everything a terminal would act on written as an escape:
// control characters (C0, DEL, C1) and bytes that are not UTF-8 as \xNN,
// bidirectional controls and line/paragraph separators as \uNNNN. Printable
// UTF-8 (any script) and backslashes stay as they are. With
// `keep_newlines`, '\n' and '\t' stay too (docs); otherwise they are escaped
// as well (names, one-line messages).
std::string escape_for_terminal(absl::string_view text, bool keep_newlines = false);

// Whether `text` is well-formed UTF-8 (no overlong forms, surrogates or code
// points past U+10FFFF). On false, `*bad_at` (when given) is the offset of
// the first byte that is not.
bool is_valid_utf8(absl::string_view text, size_t* bad_at = nullptr);

// Appends the UTF-8 form of `code_point` (at most U+10FFFF; callers that
// decode escapes have rejected surrogates and larger values) to `*out`.
void append_utf8(std::string* out, uint32_t code_point);

// The value of `digits` read as hexadecimal (escape decoders: \uXXXX,
// \xXX), or nullopt when it is empty, longer than 8 digits or holds anything
// but 0-9, a-f, A-F (no sign, prefix or spaces).
std::optional<uint32_t> parse_hex_digits(absl::string_view digits);

}  // namespace ember::serialization

#endif  // EMBER_SERIALIZATION_PRINTABLE_H_
