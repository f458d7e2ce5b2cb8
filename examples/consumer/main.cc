// A program built outside Ember's workspace against @ember//:ember.
#include <iostream>

#include "absl/strings/str_join.h"

int main() {
  std::cout << absl::StrJoin({"consumer", "built", "against", "@ember"}, " ")
            << "\n";
  return 0;
}
