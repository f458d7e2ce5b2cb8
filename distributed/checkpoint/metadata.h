// The metadata file of a distributed checkpoint (README.md, "Format"): for
// every global tensor its dtype and shape, and for every stored chunk (a box
// of it) the data file, byte range and CRC-32C of each block.
//
//   ```cpp compile-only
//   #include "distributed/checkpoint/metadata.h"
//   namespace dcp = ember::distributed::checkpoint;
//   EMBER_ASSIGN_OR_RETURN(dcp::Metadata md, dcp::read_metadata("/ckpt/step100"));
//   for (const auto& [key, t] : md.tensors) {
//     std::cout << key << " " << ember::ShapeToString(t.global_shape) << " in "
//               << t.chunks.size() << " chunks\n";
//   }
//   ```
//
// Thread-safety: value types and free functions.
#ifndef EMBER_DISTRIBUTED_CHECKPOINT_METADATA_H_
#define EMBER_DISTRIBUTED_CHECKPOINT_METADATA_H_

#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "tensor/dtype.h"
#include "tensor/shape.h"

namespace ember::distributed::checkpoint {

// The metadata file's name inside a checkpoint directory.
inline constexpr char kMetadataFileName[] = "metadata.json";
// A collective-free save's part of rank r: kMetadataPartPrefix + r + ".json"
// (Note [Collective-free saves] in checkpoint.h).
inline constexpr char kMetadataPartPrefix[] = "metadata.rank";
// The "format" field and the version this code writes (and reads).
inline constexpr char kFormatName[] = "ember-distributed-checkpoint";
inline constexpr int kFormatVersion = 1;

// One stored box of a global tensor, row-major and contiguous in `file`.
struct ChunkMetadata {
  SizeVector offsets;
  SizeVector sizes;
  std::string file;  // relative to the checkpoint directory
  int64_t offset = 0;  // byte offset in `file`
  int64_t length = 0;  // bytes: numel(sizes) * element size
  int64_t block_bytes = 0;  // bytes per checksum block (the last may be shorter)
  std::vector<uint32_t> crc32c;  // one per block
};

struct TensorMetadata {
  Dtype dtype = kFloat32;
  SizeVector global_shape;
  std::vector<ChunkMetadata> chunks;
};

struct Metadata {
  int version = kFormatVersion;
  int world_size = 1;  // ranks that saved
  std::vector<std::pair<std::string, TensorMetadata>> tensors;  // in save order

  // The entry of `key`, or null.
  const TensorMetadata* find(absl::string_view key) const;
};

// The JSON text of `metadata` (README.md, "Format").
std::string encode_metadata(const Metadata& metadata);
// Parses and checks encode_metadata's output: InvalidArgument naming
// `source` and what is malformed (not JSON, a missing field, an unknown
// dtype, a chunk outside its tensor, a newer version).
absl::StatusOr<Metadata> decode_metadata(absl::string_view json, absl::string_view source);
// Reads <checkpoint_dir>/metadata.json, or, when the directory holds a
// collective-free save instead, merges its ranks' parts (every part's tensors
// in rank order, identical chunks once). NotFound when neither is there, or
// when some rank's part is missing (naming the ranks); InvalidArgument for
// parts that disagree on the world size or a key's dtype or shape.
absl::StatusOr<Metadata> read_metadata(const std::string& checkpoint_dir);

// The dtype whose dtype_name() is `name` ("float32", ...).
absl::StatusOr<Dtype> dtype_from_name(absl::string_view name);

}  // namespace ember::distributed::checkpoint

#endif  // EMBER_DISTRIBUTED_CHECKPOINT_METADATA_H_
