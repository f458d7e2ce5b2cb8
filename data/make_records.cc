// make_records: packs an image folder (root/<class>/<image>.jpg, as
// ImageFolder reads it) into one record file (Note [Record files] in
// record_file.h) that ImageRecords reads by memory mapping.
//
//   bazel run //data:make_records -- --root=train --out=train.records
#include <cstdio>
#include <string>

#include "data/image_folder.h"

int main(int argc, char** argv) {
  std::string root, out;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--root=", 0) == 0) {
      root = arg.substr(7);
    } else if (arg.rfind("--out=", 0) == 0) {
      out = arg.substr(6);
    } else {
      std::fprintf(stderr, "make_records: unknown argument '%s'; expected --root and --out\n",
                   argv[i]);
      return 2;
    }
  }
  if (root.empty() || out.empty()) {
    std::fprintf(stderr, "make_records: needs --root=DIR (an image folder) and --out=FILE\n");
    return 2;
  }
  absl::StatusOr<int64_t> n = ember::data::write_image_folder_records(root, out);
  if (!n.ok()) {
    std::fprintf(stderr, "make_records: %s\n", std::string(n.status().message()).c_str());
    return 1;
  }
  std::printf("make_records: %lld images from %s into %s\n", static_cast<long long>(*n),
              root.c_str(), out.c_str());
  return 0;
}
