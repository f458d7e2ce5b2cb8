#include "distributed/checkpoint/checkpoint.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/unique_fd.h"
#include "distributed/checkpoint/crc32c.h"
#include "distributed/checkpoint/data_file.h"
#include "distributed/checkpoint/metadata.h"
#include "tensor/error.h"
#include "tensor/factories.h"
#include "tensor/status_macros.h"

namespace ember::distributed::checkpoint {
namespace {

namespace fs = std::filesystem;

// --- Boxes -------------------------------------------------------------------------

// A box of a global tensor: [offsets[d], offsets[d] + sizes[d]) in every dim.
struct Box {
  SizeVector offsets;
  SizeVector sizes;
  bool operator==(const Box& o) const { return offsets == o.offsets && sizes == o.sizes; }
  bool operator<(const Box& o) const {
    return std::tie(offsets, sizes) < std::tie(o.offsets, o.sizes);
  }
};

std::string BoxToString(const Box& b) {
  std::vector<std::string> dims;
  for (size_t d = 0; d < b.offsets.size(); ++d) {
    dims.push_back(absl::StrCat(b.offsets[d], ":", b.offsets[d] + b.sizes[d]));
  }
  return absl::StrCat("[", absl::StrJoin(dims, ", "), "]");
}

// The intersection of two boxes of one tensor; false when empty.
bool Intersect(const Box& a, const Box& b, Box* out) {
  out->offsets.resize(a.offsets.size());
  out->sizes.resize(a.offsets.size());
  for (size_t d = 0; d < a.offsets.size(); ++d) {
    const int64_t lo = std::max(a.offsets[d], b.offsets[d]);
    const int64_t hi = std::min(a.offsets[d] + a.sizes[d], b.offsets[d] + b.sizes[d]);
    if (hi <= lo) return false;
    out->offsets[d] = lo;
    out->sizes[d] = hi - lo;
  }
  return true;
}

// Note [Flat ranges as boxes]
// A flat range [a, b) of a tensor's row-major elements is the union of at
// most 2 * ndim - 1 boxes, each contiguous in row-major order: within a dim
// whose inner block (the product of the sizes after it) is I, the range splits
// into a partial leading row, whole rows [ceil(a/I), floor(b/I)) as one box,
// and a partial trailing row; the partial rows recurse into the next dim.
// The boxes come out in row-major order, so each is a contiguous piece of the
// local 1-D tensor. The files only ever hold boxes (PyTorch's chunk
// metadata), so a checkpoint saved from flat shards loads into boxes and back.
void FlatToBoxes(IntArrayRef shape, size_t dim, SizeVector prefix, int64_t a, int64_t b,
                 std::vector<Box>* out) {
  if (a >= b) return;
  const size_t n = shape.size();
  int64_t inner = 1;
  for (size_t d = dim + 1; d < n; ++d) inner *= shape[d];
  auto emit_rows = [&](int64_t r0, int64_t r1) {
    Box box;
    box.offsets = prefix;
    box.sizes.assign(prefix.size(), 1);
    box.offsets.push_back(r0);
    box.sizes.push_back(r1 - r0);
    for (size_t d = dim + 1; d < n; ++d) {
      box.offsets.push_back(0);
      box.sizes.push_back(shape[d]);
    }
    out->push_back(std::move(box));
  };
  if (a % inner == 0 && b % inner == 0) {
    emit_rows(a / inner, b / inner);
    return;
  }
  const int64_t r0 = a / inner, r1 = b / inner;
  auto recurse_row = [&](int64_t row, int64_t lo, int64_t hi) {
    SizeVector p = prefix;
    p.push_back(row);
    FlatToBoxes(shape, dim + 1, p, lo, hi, out);
  };
  if (r0 == r1) {
    recurse_row(r0, a - r0 * inner, b - r0 * inner);
    return;
  }
  int64_t first_full = r0;
  if (a % inner != 0) {
    recurse_row(r0, a - r0 * inner, inner);
    first_full = r0 + 1;
  }
  if (first_full < r1) emit_rows(first_full, r1);
  if (b % inner != 0) recurse_row(r1, 0, b - r1 * inner);
}

// One box of an item with the local tensor that holds it (a view).
struct Piece {
  Box box;
  Tensor local;
};

// Note [Device tensors in checkpoints]
// The files hold bytes, not devices (as PyTorch's FileSystemWriter). An item
// on a device is staged through a host copy: save writes a CPU copy made on
// the device's current stream (so it holds every write queued there before
// the save), and load reads into a host tensor of the item's shape and then
// copies that into the device tensor. Placements describe the item's own tensor, and the
// copy has its shape, so the same pieces apply to both.

// `item` with its tensor on the CPU: itself, or for a device item a host
// tensor of its shape and dtype holding its values (`with_values`, to save)
// or not yet (to load: the pieces cover all of it).
Item OnHost(const Item& item, bool with_values) {
  if (!item.tensor.defined() || item.tensor.is_cpu()) return item;
  Tensor host = with_values
                    ? item.tensor.detach().to(kCPU)
                    : empty(item.tensor.sizes(), TensorOptions().dtype(item.tensor.dtype()));
  return Item{std::move(host), item.placement};
}

// Checks `item` (on the CPU: OnHost) and returns its pieces.
absl::StatusOr<std::vector<Piece>> Pieces(const std::string& key, const Item& item) {
  if (!item.tensor.defined()) {
    return absl::InvalidArgumentError(absl::StrCat("state_dict[\"", key, "\"] is undefined"));
  }
  const Tensor t = item.tensor.detach();
  std::vector<Piece> out;
  if (!item.placement.has_value()) {
    Box box;
    box.offsets.assign(t.dim(), 0);
    box.sizes = SizeVector(t.sizes().begin(), t.sizes().end());
    out.push_back({std::move(box), t});
    return out;
  }
  const Placement& p = *item.placement;
  for (int64_t s : p.global_shape) {
    if (s < 0) {
      return absl::InvalidArgumentError(absl::StrCat("state_dict[\"", key, "\"]: global shape ",
                                                     ShapeToString(p.global_shape),
                                                     " has a negative size"));
    }
  }
  if (p.is_flat()) {
    // The range indexes the box at p.offsets of sizes p.box_sizes, or the
    // whole tensor when both are empty.
    const bool in_box = !p.offsets.empty() || !p.box_sizes.empty();
    const SizeVector& shape = in_box ? p.box_sizes : p.global_shape;
    if (t.dim() != 1 || (in_box && (p.offsets.size() != p.global_shape.size() ||
                                    p.box_sizes.size() != p.global_shape.size()))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "state_dict[\"", key, "\"]: a flat shard needs a 1-D local tensor and, inside a box, ",
          "one offset and one box size per dimension of the global shape ",
          ShapeToString(p.global_shape), " (got a local tensor of shape ",
          ShapeToString(t.sizes()), ", offsets ", ShapeToString(p.offsets), " and box sizes ",
          ShapeToString(p.box_sizes), ")"));
    }
    for (size_t d = 0; in_box && d < p.offsets.size(); ++d) {
      if (p.offsets[d] < 0 || p.box_sizes[d] < 0 || p.offsets[d] + p.box_sizes[d] > p.global_shape[d]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "state_dict[\"", key, "\"]: the box of sizes ", ShapeToString(p.box_sizes),
            " at offsets ", ShapeToString(p.offsets), " leaves the global shape ",
            ShapeToString(p.global_shape), " in dim ", d));
      }
    }
    const int64_t total = Numel(shape);
    if (p.flat_offset + t.numel() > total) {
      return absl::InvalidArgumentError(absl::StrCat(
          "state_dict[\"", key, "\"]: flat shard [", p.flat_offset, ", ", p.flat_offset + t.numel(),
          ") leaves the ", in_box ? "box" : "global tensor", " of shape ", ShapeToString(shape), " (",
          total, " elements)"));
    }
    std::vector<Box> boxes;
    if (shape.empty()) {
      if (t.numel() == 1) boxes.push_back({});
    } else {
      FlatToBoxes(shape, 0, {}, p.flat_offset, p.flat_offset + t.numel(), &boxes);
    }
    for (Box& b : boxes) {
      for (size_t d = 0; in_box && d < b.offsets.size(); ++d) b.offsets[d] += p.offsets[d];
    }
    int64_t pos = 0;
    const int64_t stride = t.numel() > 0 ? t.stride(0) : 1;
    for (Box& b : boxes) {
      const int64_t n = Numel(b.sizes);
      SizeVector strides = ContiguousStrides(b.sizes);
      for (int64_t& s : strides) s *= stride;
      Tensor view = t.as_strided(b.sizes, strides, t.storage_offset() + pos * stride);
      pos += n;
      out.push_back({std::move(b), std::move(view)});
    }
    return out;
  }
  if (p.offsets.size() != p.global_shape.size() ||
      t.dim() != static_cast<int64_t>(p.global_shape.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("state_dict[\"", key, "\"]: local tensor of shape ", ShapeToString(t.sizes()),
                     ", offsets ", ShapeToString(p.offsets), " and global shape ",
                     ShapeToString(p.global_shape), " must have the same number of dimensions"));
  }
  for (size_t d = 0; d < p.offsets.size(); ++d) {
    if (p.offsets[d] < 0 || p.offsets[d] + t.size(d) > p.global_shape[d]) {
      return absl::InvalidArgumentError(
          absl::StrCat("state_dict[\"", key, "\"]: the local tensor of shape ",
                       ShapeToString(t.sizes()), " at offsets ", ShapeToString(p.offsets),
                       " leaves the global shape ", ShapeToString(p.global_shape), " in dim ", d));
    }
  }
  Box box{p.offsets, SizeVector(t.sizes().begin(), t.sizes().end())};
  out.push_back({std::move(box), t});
  return out;
}

SizeVector GlobalShape(const Item& item) {
  if (item.placement.has_value()) return item.placement->global_shape;
  return SizeVector(item.tensor.sizes().begin(), item.tensor.sizes().end());
}

// --- Bytes exchanged between ranks -----------------------------------------------

class ByteWriter {
 public:
  void Int(int64_t v) { out_.append(reinterpret_cast<const char*>(&v), sizeof(v)); }
  void Str(absl::string_view s) {
    Int(static_cast<int64_t>(s.size()));
    out_.append(s.data(), s.size());
  }
  void Ints(IntArrayRef v) {
    Int(static_cast<int64_t>(v.size()));
    for (int64_t x : v) Int(x);
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

class ByteReader {
 public:
  explicit ByteReader(absl::string_view in) : in_(in) {}
  int64_t Int() {
    int64_t v = 0;
    if (pos_ + sizeof(v) > in_.size()) {
      ok_ = false;
      return 0;
    }
    std::memcpy(&v, in_.data() + pos_, sizeof(v));
    pos_ += sizeof(v);
    return v;
  }
  std::string Str() {
    const int64_t n = Int();
    if (n < 0 || pos_ + n > in_.size()) {
      ok_ = false;
      return {};
    }
    std::string s(in_.substr(pos_, n));
    pos_ += n;
    return s;
  }
  SizeVector Ints() {
    const int64_t n = Int();
    SizeVector v;
    if (n < 0 || n > 1024) {
      ok_ = false;
      return v;
    }
    for (int64_t i = 0; i < n; ++i) v.push_back(Int());
    return v;
  }
  bool ok() const { return ok_; }

 private:
  absl::string_view in_;
  size_t pos_ = 0;
  bool ok_ = true;
};

// Every rank's `mine`, by rank (an all_gather of the lengths, then of the
// bytes padded to the longest).
absl::StatusOr<std::vector<std::string>> AllGatherBytes(ProcessGroup& pg, const std::string& mine,
                                                        std::optional<absl::Duration> timeout,
                                                        absl::string_view step) {
  const int n = pg.size();
  auto fail = [&](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat("distributed checkpoint save, ", step, " (rank ",
                                               pg.rank(), "): ", s.message()));
  };
  Tensor len = full({1}, static_cast<int64_t>(mine.size()), kInt64);
  std::vector<Tensor> lens;
  for (int r = 0; r < n; ++r) lens.push_back(empty({1}, kInt64));
  {
    auto work = pg.allgather(lens, len, {.timeout = timeout});
    if (!work.ok()) return fail(work.status());
    absl::Status s = (*work)->wait();
    if (!s.ok()) return fail(s);
  }
  int64_t longest = 1;
  for (const Tensor& l : lens) longest = std::max(longest, l.data_ptr<int64_t>()[0]);
  Tensor buf = zeros({longest}, kUInt8);
  std::memcpy(buf.raw_data(), mine.data(), mine.size());
  std::vector<Tensor> bufs;
  for (int r = 0; r < n; ++r) bufs.push_back(empty({longest}, kUInt8));
  {
    auto work = pg.allgather(bufs, buf, {.timeout = timeout});
    if (!work.ok()) return fail(work.status());
    absl::Status s = (*work)->wait();
    if (!s.ok()) return fail(s);
  }
  std::vector<std::string> out;
  for (int r = 0; r < n; ++r) {
    out.emplace_back(static_cast<const char*>(bufs[r].raw_data()), lens[r].data_ptr<int64_t>()[0]);
  }
  return out;
}

// --- Plans -------------------------------------------------------------------------

// What one rank holds: its error (if its state dict is malformed), and per
// key the dtype, global shape and boxes. Rank 0 also names the temporary
// directory.
struct EntryPlan {
  std::string key;
  Dtype dtype = kFloat32;
  SizeVector global_shape;
  std::vector<Box> boxes;
};
struct RankPlan {
  std::string error;
  std::string temp_dir;
  std::vector<EntryPlan> entries;
};

std::string EncodePlan(const RankPlan& p) {
  ByteWriter w;
  w.Str(p.error);
  w.Str(p.temp_dir);
  w.Int(static_cast<int64_t>(p.entries.size()));
  for (const EntryPlan& e : p.entries) {
    w.Str(e.key);
    w.Int(static_cast<int64_t>(e.dtype));
    w.Ints(e.global_shape);
    w.Int(static_cast<int64_t>(e.boxes.size()));
    for (const Box& b : e.boxes) {
      w.Ints(b.offsets);
      w.Ints(b.sizes);
    }
  }
  return w.Take();
}

absl::StatusOr<RankPlan> DecodePlan(absl::string_view bytes, int rank) {
  ByteReader r(bytes);
  RankPlan p;
  p.error = r.Str();
  p.temp_dir = r.Str();
  const int64_t n = r.Int();
  for (int64_t i = 0; r.ok() && i < n; ++i) {
    EntryPlan e;
    e.key = r.Str();
    e.dtype = static_cast<Dtype>(r.Int());
    e.global_shape = r.Ints();
    const int64_t nb = r.Int();
    for (int64_t j = 0; r.ok() && j < nb; ++j) {
      Box b;
      b.offsets = r.Ints();
      b.sizes = r.Ints();
      e.boxes.push_back(std::move(b));
    }
    p.entries.push_back(std::move(e));
  }
  if (!r.ok()) {
    return absl::DataLossError(
        absl::StrCat("distributed checkpoint save: rank ", rank, "'s plan arrived malformed"));
  }
  return p;
}

// One box of the global plan: who writes it.
struct Assignment {
  size_t key_index;  // into rank 0's entries
  Box box;
  int writer;
};

// Note [Global plan]
// Every rank computes the same global plan from every rank's plan, so no
// second exchange is needed: keys in rank 0's order; for each key, the
// distinct boxes in order of (lowest holding rank, its box order); a box
// held by several ranks (a replicated tensor, or a shard replicated across
// data-parallel groups) is written once, by the holder with the fewest bytes
// assigned so far (ties: the lowest rank), which spreads replicated tensors
// over the ranks as PyTorch's deduplication does.
absl::StatusOr<std::vector<Assignment>> GlobalPlan(const std::vector<RankPlan>& plans) {
  const RankPlan& first = plans[0];
  const int world = static_cast<int>(plans.size());
  std::vector<std::map<std::string, const EntryPlan*>> by_key(world);
  for (int r = 0; r < world; ++r) {
    for (const EntryPlan& e : plans[r].entries) by_key[r][e.key] = &e;
  }
  for (int r = 1; r < world; ++r) {
    for (const EntryPlan& e : plans[r].entries) {
      if (!by_key[0].count(e.key)) {
        return absl::InvalidArgumentError(
            absl::StrCat("distributed checkpoint save: rank ", r, " saves \"", e.key,
                         "\" but rank 0 does not; every rank must pass the same keys"));
      }
    }
  }
  std::vector<int64_t> assigned_bytes(world, 0);
  std::vector<Assignment> out;
  for (size_t k = 0; k < first.entries.size(); ++k) {
    const EntryPlan& e0 = first.entries[k];
    std::vector<std::pair<Box, std::vector<int>>> distinct;  // box, holders
    for (int r = 0; r < world; ++r) {
      auto it = by_key[r].find(e0.key);
      if (it == by_key[r].end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("distributed checkpoint save: rank 0 saves \"", e0.key, "\" but rank ", r,
                         " does not; every rank must pass the same keys"));
      }
      const EntryPlan& e = *it->second;
      if (e.dtype != e0.dtype || e.global_shape != e0.global_shape) {
        return absl::InvalidArgumentError(absl::StrCat(
            "distributed checkpoint save: \"", e0.key, "\" is ", std::string(dtype_name(e0.dtype)),
            " ", ShapeToString(e0.global_shape), " on rank 0 but ",
            std::string(dtype_name(e.dtype)), " ", ShapeToString(e.global_shape), " on rank ", r,
            "; every rank must describe the same global tensor"));
      }
      for (const Box& b : e.boxes) {
        auto same = std::find_if(distinct.begin(), distinct.end(),
                                 [&](const auto& d) { return d.first == b; });
        if (same == distinct.end()) {
          distinct.push_back({b, {r}});
        } else if (same->second.back() != r) {
          same->second.push_back(r);
        }
      }
    }
    // Distinct boxes must not overlap, and must cover the tensor.
    int64_t covered = 0;
    for (size_t i = 0; i < distinct.size(); ++i) {
      covered += Numel(distinct[i].first.sizes);
      for (size_t j = 0; j < i; ++j) {
        Box both;
        if (Intersect(distinct[i].first, distinct[j].first, &both) && Numel(both.sizes) > 0) {
          return absl::InvalidArgumentError(
              absl::StrCat("distributed checkpoint save: \"", e0.key, "\": the piece ",
                           BoxToString(distinct[i].first), " of rank ", distinct[i].second[0],
                           " overlaps the piece ", BoxToString(distinct[j].first), " of rank ",
                           distinct[j].second[0], " without being equal to it"));
        }
      }
    }
    const int64_t total = Numel(e0.global_shape);
    if (covered != total) {
      return absl::InvalidArgumentError(
          absl::StrCat("distributed checkpoint save: the ranks' pieces of \"", e0.key, "\" (shape ",
                       ShapeToString(e0.global_shape), ") cover ", covered, " of its ", total,
                       " elements; every element must be held by some rank"));
    }
    const int64_t elem = static_cast<int64_t>(element_size(e0.dtype));
    for (auto& [box, holders] : distinct) {
      int writer = holders[0];
      for (int h : holders) {
        if (assigned_bytes[h] < assigned_bytes[writer]) writer = h;
      }
      assigned_bytes[writer] += Numel(box.sizes) * elem;
      out.push_back({k, box, writer});
    }
  }
  return out;
}

// 64-bit FNV-1a: a digest every rank computes alike (absl::Hash is seeded
// per process).
uint64_t Fnv1a(absl::string_view bytes, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

// The digest of a rank's layout: its plan without the temporary directory
// (which changes every save). 0 is never a layout's digest: it marks a rank
// that cannot reuse (an error in its state dict).
uint64_t LayoutDigest(const RankPlan& plan) {
  if (!plan.error.empty()) return 0;
  RankPlan layout = plan;
  layout.temp_dir.clear();
  const uint64_t h = Fnv1a(EncodePlan(layout));
  return h == 0 ? 1 : h;
}

// --- Files -------------------------------------------------------------------------

absl::Status WriteAll(int fd, const char* data, size_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, data, std::min<size_t>(n, size_t{1} << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      return absl::ErrnoToStatus(errno, absl::StrCat("cannot write ", path));
    }
    data += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

absl::Status SyncDir(const std::string& dir) {
  base::UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot open directory ", dir));
  if (::fsync(fd.get()) != 0)
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot fsync directory ", dir));
  return absl::OkStatus();
}

absl::Status WriteFile(const std::string& path, absl::string_view bytes, bool sync) {
  base::UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot create ", path));
  EMBER_RETURN_IF_ERROR(WriteAll(fd.get(), bytes.data(), bytes.size(), path));
  if (sync && ::fsync(fd.get()) != 0)
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot fsync ", path));
  return absl::OkStatus();
}

std::string DataFileName(int rank) { return absl::StrCat("__", rank, "_0.distcp"); }

// Writes this rank's assigned pieces into <temp_dir>/__<rank>_0.distcp and
// returns their chunk metadata (key index, chunk).
absl::StatusOr<std::vector<std::pair<size_t, ChunkMetadata>>> WritePieces(
    const std::vector<Assignment>& plan, int rank, const std::string& temp_dir,
    const std::vector<EntryPlan>& keys0, const std::map<std::string, std::vector<Piece>>& mine,
    const CheckpointOptions& options) {
  std::vector<std::pair<size_t, ChunkMetadata>> out;
  const std::string name = DataFileName(rank);
  const std::string path = absl::StrCat(temp_dir, "/", name);
  std::optional<DataFileWriter> file;
  const int64_t block = std::max<int64_t>(options.checksum_block_bytes, 4096);
  for (const Assignment& a : plan) {
    if (a.writer != rank) continue;
    if (!file.has_value()) {
      EMBER_ASSIGN_OR_RETURN(DataFileWriter created,
                             DataFileWriter::Create(path, options.direct_io));
      file.emplace(std::move(created));
    }
    const std::string& key = keys0[a.key_index].key;
    const std::vector<Piece>& pieces = mine.at(key);
    auto piece =
        std::find_if(pieces.begin(), pieces.end(), [&](const Piece& p) { return p.box == a.box; });
    EMBER_INTERNAL_ASSERT(piece != pieces.end(), "a planned piece is not held by its writer");
    const Tensor data = piece->local.contiguous();
    const char* bytes = static_cast<const char*>(data.raw_data());
    const int64_t length = static_cast<int64_t>(data.nbytes());
    ChunkMetadata ch;
    ch.offsets = a.box.offsets;
    ch.sizes = a.box.sizes;
    ch.file = name;
    ch.offset = file->size();
    ch.length = length;
    ch.block_bytes = block;
    for (int64_t pos = 0; pos < length; pos += block) {
      ch.crc32c.push_back(crc32c(bytes + pos, std::min(block, length - pos)));
    }
    EMBER_RETURN_IF_ERROR(file->Append(bytes, static_cast<size_t>(length)));
    out.emplace_back(a.key_index, std::move(ch));
  }
  if (file.has_value()) EMBER_RETURN_IF_ERROR(file->Close(options.sync_files));
  return out;
}

std::string EncodeResult(const absl::Status& status,
                         const std::vector<std::pair<size_t, ChunkMetadata>>& chunks) {
  ByteWriter w;
  w.Str(status.ok() ? "" : status.ToString());
  w.Int(static_cast<int64_t>(chunks.size()));
  for (const auto& [k, ch] : chunks) {
    w.Int(static_cast<int64_t>(k));
    w.Ints(ch.offsets);
    w.Ints(ch.sizes);
    w.Str(ch.file);
    w.Int(ch.offset);
    w.Int(ch.length);
    w.Int(ch.block_bytes);
    w.Int(static_cast<int64_t>(ch.crc32c.size()));
    for (uint32_t c : ch.crc32c) w.Int(c);
  }
  return w.Take();
}

bool DecodeResult(absl::string_view bytes, std::string* error,
                  std::vector<std::pair<size_t, ChunkMetadata>>* chunks) {
  ByteReader r(bytes);
  *error = r.Str();
  const int64_t n = r.Int();
  for (int64_t i = 0; r.ok() && i < n; ++i) {
    ChunkMetadata ch;
    const size_t k = static_cast<size_t>(r.Int());
    ch.offsets = r.Ints();
    ch.sizes = r.Ints();
    ch.file = r.Str();
    ch.offset = r.Int();
    ch.length = r.Int();
    ch.block_bytes = r.Int();
    const int64_t nc = r.Int();
    for (int64_t j = 0; r.ok() && j < nc && j < (int64_t{1} << 40); ++j) {
      ch.crc32c.push_back(static_cast<uint32_t>(r.Int()));
    }
    chunks->emplace_back(k, std::move(ch));
  }
  return r.ok();
}

// Note [Atomic commit]
// Every rank writes into <path>.tmp-<id> (one id, chosen by rank 0 and sent
// with its plan); rank 0 writes metadata.json last, once every rank has
// reported its pieces written (and fsynced), and then swaps the directory in:
// rename(2) when `path` does not exist yet, else renameat2(RENAME_EXCHANGE),
// which atomically exchanges the two directories, after which the old
// checkpoint (now under the temporary name) is removed. A reader therefore
// sees either the old checkpoint or the new one, never a mix, and a save that
// dies at any point before the exchange leaves `path` untouched (its
// temporary directory stays behind and the next successful save of the same
// path removes it). File systems without RENAME_EXCHANGE get two renames,
// with a window in which `path` is missing but the old checkpoint is whole at
// <path>.old-<id>.
absl::Status Commit(const std::string& temp_dir, const std::string& path, const std::string& id,
                    bool sync) {
  std::error_code ec;
  const bool exists = fs::exists(path, ec);
  if (!exists) {
    if (::rename(temp_dir.c_str(), path.c_str()) == 0) return absl::OkStatus();
    if (errno != EEXIST && errno != ENOTEMPTY) {
      return absl::ErrnoToStatus(errno, absl::StrCat("cannot rename ", temp_dir, " to ", path));
    }
  }
  if (::renameat2(AT_FDCWD, temp_dir.c_str(), AT_FDCWD, path.c_str(), RENAME_EXCHANGE) == 0) {
    fs::remove_all(temp_dir, ec);  // the old checkpoint
    return absl::OkStatus();
  }
  if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot exchange ", temp_dir, " with ", path));
  }
  const std::string old = absl::StrCat(path, ".old-", id);
  if (::rename(path.c_str(), old.c_str()) != 0) {
    return absl::ErrnoToStatus(errno,
                               absl::StrCat("cannot move the old checkpoint to ", old, ": ", path));
  }
  if (::rename(temp_dir.c_str(), path.c_str()) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot rename ", temp_dir, " to ", path));
  }
  fs::remove_all(old, ec);
  return absl::OkStatus();
}

// Temporary directories of earlier saves of `path` that died (and old
// checkpoints a two-rename commit left, see Note [Atomic commit]).
void RemoveStaleTempDirs(const std::string& path) {
  const fs::path p(path);
  const std::string tmp = p.filename().string() + ".tmp-";
  const std::string old = p.filename().string() + ".old-";
  std::error_code ec;
  for (const auto& entry :
       fs::directory_iterator(p.parent_path().empty() ? "." : p.parent_path(), ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(tmp, 0) == 0 || name.rfind(old, 0) == 0) fs::remove_all(entry.path(), ec);
  }
}

std::string NewId() {
  std::random_device rd;
  std::mt19937_64 gen((static_cast<uint64_t>(rd()) << 32) ^ rd() ^
                      static_cast<uint64_t>(::getpid()));
  return absl::StrFormat("%016x", gen());
}

// Rank 0's own checks of the destination, before anything is written.
absl::Status CheckDestination(const std::string& path) {
  if (path.empty()) {
    return absl::InvalidArgumentError(
        "distributed checkpoint: CheckpointOptions.path is empty; name the checkpoint "
        "directory");
  }
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) return absl::OkStatus();
  if (!fs::is_directory(st)) {
    return absl::FailedPreconditionError(
        absl::StrCat("distributed checkpoint: ", path,
                     " exists and is not a directory; refusing to replace it"));
  }
  if (!fs::is_empty(path, ec) && !fs::exists(fs::path(path) / kMetadataFileName, ec)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "distributed checkpoint: ", path, " is a non-empty directory without ", kMetadataFileName,
        "; refusing to replace what is not a distributed checkpoint"));
  }
  return absl::OkStatus();
}

// --- Loading -----------------------------------------------------------------------

class FileCache {
 public:
  explicit FileCache(std::string dir) : dir_(std::move(dir)) {}
  absl::StatusOr<int> Get(const std::string& name) {
    auto it = fds_.find(name);
    if (it != fds_.end()) return it->second.get();
    const std::string path = absl::StrCat(dir_, "/", name);
    base::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0)
      return absl::ErrnoToStatus(errno, absl::StrCat("cannot open checkpoint file ", path));
    const int raw = fd.get();
    fds_.emplace(name, std::move(fd));
    return raw;
  }
  std::string PathOf(const std::string& name) const { return absl::StrCat(dir_, "/", name); }

 private:
  std::string dir_;
  std::map<std::string, base::UniqueFd> fds_;
};

absl::Status ReadAt(int fd, char* dst, int64_t n, int64_t offset, const std::string& path) {
  int64_t done = 0;
  while (done < n) {
    const ssize_t r =
        ::pread(fd, dst + done, std::min<int64_t>(n - done, int64_t{1} << 30), offset + done);
    if (r < 0) {
      if (errno == EINTR) continue;
      return absl::ErrnoToStatus(errno, absl::StrCat("cannot read ", path));
    }
    if (r == 0) {
      return absl::DataLossError(absl::StrCat("checkpoint file ", path, " is truncated: bytes [",
                                              offset, ", ", offset + n,
                                              ") were expected, it ends at ", offset + done));
    }
    done += r;
  }
  return absl::OkStatus();
}

absl::Status VerifyBlocks(const char* data, const ChunkMetadata& ch, int64_t first_block,
                          int64_t last_block, const std::string& path) {
  for (int64_t b = first_block; b <= last_block; ++b) {
    const int64_t start = b * ch.block_bytes;
    const int64_t n = std::min(ch.block_bytes, ch.length - start);
    const uint32_t got = crc32c(data + (start - first_block * ch.block_bytes), n);
    if (got != ch.crc32c[b]) {
      return absl::DataLossError(absl::StrFormat(
          "checkpoint file %s: bytes [%d, %d) fail their checksum (crc32c %08x, recorded %08x); "
          "the file was changed or damaged after the save",
          path, ch.offset + start, ch.offset + start + n, got, ch.crc32c[b]));
    }
  }
  return absl::OkStatus();
}

// Copies the part `want` (a box of the global tensor) of chunk `ch` into
// `dst`, the view of the target that holds `want`.
absl::Status ReadRegion(const ChunkMetadata& ch, Dtype dtype, const Box& want, const Tensor& dst,
                        FileCache& files) {
  EMBER_ASSIGN_OR_RETURN(int fd, files.Get(ch.file));
  const std::string path = files.PathOf(ch.file);
  const int64_t elem = static_cast<int64_t>(element_size(dtype));
  const SizeVector strides = ContiguousStrides(ch.sizes);
  int64_t first = 0, last = 0;  // element indices within the chunk
  for (size_t d = 0; d < ch.sizes.size(); ++d) {
    const int64_t lo = want.offsets[d] - ch.offsets[d];
    first += lo * strides[d];
    last += (lo + want.sizes[d] - 1) * strides[d];
  }
  const int64_t first_block = first * elem / ch.block_bytes;
  const int64_t last_block = ((last + 1) * elem - 1) / ch.block_bytes;
  const int64_t begin = first_block * ch.block_bytes;
  const int64_t end = std::min((last_block + 1) * ch.block_bytes, ch.length);
  // The whole chunk into a contiguous target of the same dtype: read in place.
  if (want == Box{ch.offsets, ch.sizes} && dst.is_contiguous() && dst.dtype() == dtype) {
    char* out = static_cast<char*>(dst.raw_data());
    EMBER_RETURN_IF_ERROR(ReadAt(fd, out, ch.length, ch.offset, path));
    return VerifyBlocks(out, ch, first_block, last_block, path);
  }
  std::string buf(static_cast<size_t>(end - begin), '\0');
  EMBER_RETURN_IF_ERROR(ReadAt(fd, buf.data(), end - begin, ch.offset + begin, path));
  EMBER_RETURN_IF_ERROR(VerifyBlocks(buf.data(), ch, first_block, last_block, path));
  Tensor src = from_blob(buf.data() + (first * elem - begin), want.sizes, strides, dtype);
  dst.copy_(src);
  return absl::OkStatus();
}

// Fills `target` (the piece `box` of global tensor `key`) from the checkpoint.
absl::Status LoadPiece(const std::string& key, const TensorMetadata& tm, const Box& box,
                       const Tensor& target, FileCache& files) {
  int64_t filled = 0;
  for (const ChunkMetadata& ch : tm.chunks) {
    Box both;
    if (!Intersect(box, Box{ch.offsets, ch.sizes}, &both)) continue;
    if (Numel(both.sizes) == 0) continue;
    Tensor dst = target;
    for (size_t d = 0; d < both.offsets.size(); ++d) {
      dst = dst.narrow(static_cast<int64_t>(d), both.offsets[d] - box.offsets[d], both.sizes[d]);
    }
    EMBER_RETURN_IF_ERROR(ReadRegion(ch, tm.dtype, both, dst, files));
    filled += Numel(both.sizes);
  }
  if (filled != Numel(box.sizes)) {
    return absl::DataLossError(absl::StrCat(
        "distributed checkpoint: the chunks of \"", key, "\" cover ", filled, " of the ",
        Numel(box.sizes), " elements of ", BoxToString(box), "; the metadata is incomplete"));
  }
  return absl::OkStatus();
}

// Note [Collective-free saves] in checkpoint.h.
absl::Status SaveCollectiveFree(const StateDict& state_dict, const CheckpointOptions& options) {
  const int rank = options.process_group ? options.process_group->rank() : 0;
  const int world = options.process_group ? options.process_group->size() : 1;
  const std::string path = fs::path(options.path).lexically_normal().string();
  auto fail = [&](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat("distributed checkpoint collective-free save to ",
                                               path, " (rank ", rank, "): ", s.message()));
  };
  if (path.empty() || path == ".") {
    return absl::InvalidArgumentError(
        "distributed checkpoint: CheckpointOptions.path is empty; name the checkpoint "
        "directory");
  }
  RankPlan plan;
  std::map<std::string, std::vector<Piece>> pieces;
  std::vector<Assignment> mine;
  for (const auto& [key, item] : state_dict) {
    if (pieces.count(key)) {
      return fail(absl::InvalidArgumentError(absl::StrCat("the key \"", key, "\" appears twice")));
    }
    absl::StatusOr<std::vector<Piece>> p = Pieces(key, OnHost(item, /*with_values=*/true));
    if (!p.ok()) return fail(p.status());
    EntryPlan e{key, item.tensor.dtype(), GlobalShape(item), {}};
    // A replicated item is the same everywhere: rank 0 writes it.
    if (item.placement.has_value() || rank == 0) {
      for (const Piece& piece : *p) {
        e.boxes.push_back(piece.box);
        mine.push_back({plan.entries.size(), piece.box, rank});
      }
    }
    plan.entries.push_back(std::move(e));
    pieces[key] = std::move(*p);
  }
  std::error_code ec;
  fs::create_directories(path, ec);
  if (!fs::is_directory(path, ec)) {
    return fail(absl::InternalError(absl::StrCat("cannot create the directory: ", ec.message())));
  }
  const std::string part = absl::StrCat(path, "/", kMetadataPartPrefix, rank, ".json");
  if (fs::exists(part, ec) || fs::exists(fs::path(path) / kMetadataFileName, ec)) {
    return fail(absl::FailedPreconditionError(absl::StrCat(
        "the directory already holds ", fs::exists(part, ec) ? "this rank's part" : "a checkpoint",
        "; collective-free saves need a directory of their own per save (e.g. one per step)")));
  }
  absl::StatusOr<std::vector<std::pair<size_t, ChunkMetadata>>> written =
      WritePieces(mine, rank, path, plan.entries, pieces, options);
  if (!written.ok()) return fail(written.status());
  std::vector<std::pair<size_t, ChunkMetadata>> chunks = *std::move(written);
  Metadata md;
  md.world_size = world;
  for (const EntryPlan& e : plan.entries) {
    md.tensors.push_back({e.key, TensorMetadata{e.dtype, e.global_shape, {}}});
  }
  for (auto& [k, ch] : chunks) md.tensors[k].second.chunks.push_back(std::move(ch));
  const std::string temp = absl::StrCat(part, ".tmp-", NewId());
  absl::Status wrote = WriteFile(temp, encode_metadata(md), options.sync_files);
  if (wrote.ok() && ::rename(temp.c_str(), part.c_str()) != 0) {
    wrote = absl::ErrnoToStatus(errno, absl::StrCat("cannot rename ", temp, " to ", part));
  }
  if (wrote.ok() && options.sync_files) wrote = SyncDir(path);
  if (!wrote.ok()) {
    fs::remove(temp, ec);
    return fail(wrote);
  }
  return absl::OkStatus();
}

}  // namespace

// Note [Cached save plans] in checkpoint.h.
struct SavePlanCache::State {
  bool valid = false;
  int world = 0;
  std::vector<RankPlan> plans;  // temp_dir cleared
  std::vector<Assignment> global;
  std::vector<uint64_t> digests;  // per rank
  uint64_t digest_of_all = 0;     // of `digests`: which plan this cache holds
  int64_t hits = 0;
  int64_t misses = 0;
};

SavePlanCache::SavePlanCache() : state_(std::make_unique<State>()) {}
SavePlanCache::~SavePlanCache() = default;
int64_t SavePlanCache::hits() const { return state_->hits; }
int64_t SavePlanCache::misses() const { return state_->misses; }

Item replicated(Tensor tensor) { return Item{std::move(tensor), std::nullopt}; }

Item shard(Tensor local, SizeVector global_shape, SizeVector offsets) {
  Placement p;
  p.global_shape = std::move(global_shape);
  p.offsets = std::move(offsets);
  return Item{std::move(local), p};
}

Item flat_shard(Tensor local, SizeVector global_shape, int64_t flat_offset,
                SizeVector box_offsets, SizeVector box_sizes) {
  Placement p;
  p.global_shape = std::move(global_shape);
  p.flat_offset = flat_offset;
  p.offsets = std::move(box_offsets);
  p.box_sizes = std::move(box_sizes);
  return Item{std::move(local), p};
}

absl::Status save(const StateDict& state_dict, const CheckpointOptions& options) {
  if (options.collective_free) return SaveCollectiveFree(state_dict, options);
  ProcessGroup* pg = options.process_group.get();
  const int rank = pg ? pg->rank() : 0;
  const int world = pg ? pg->size() : 1;
  const std::string path = fs::path(options.path).lexically_normal().string();

  // 1. This rank's plan (or its error, which still takes part in the exchange).
  RankPlan plan;
  std::map<std::string, std::vector<Piece>> pieces;
  absl::Status local = rank == 0 ? CheckDestination(path) : absl::OkStatus();
  for (const auto& [key, item] : state_dict) {
    if (!local.ok()) break;
    if (pieces.count(key)) {
      local = absl::InvalidArgumentError(
          absl::StrCat("distributed checkpoint save: the key \"", key, "\" appears twice"));
      break;
    }
    absl::StatusOr<std::vector<Piece>> p = Pieces(key, OnHost(item, /*with_values=*/true));
    if (!p.ok()) {
      local = p.status();
      break;
    }
    EntryPlan e{key, item.tensor.dtype(), GlobalShape(item), {}};
    for (const Piece& piece : *p) e.boxes.push_back(piece.box);
    plan.entries.push_back(std::move(e));
    pieces[key] = std::move(*p);
  }
  if (!local.ok()) plan.error = local.ToString();
  if (rank == 0) plan.temp_dir = absl::StrCat(path, ".tmp-", NewId());

  std::vector<RankPlan> plans;
  std::vector<Assignment> global;
  SavePlanCache::State* cache = options.plan_cache ? options.plan_cache->state_.get() : nullptr;
  bool reused = false;
  if (pg != nullptr && cache != nullptr) {
    // Note [Cached save plans]: one digest each, and rank 0's directory.
    ByteWriter w;
    w.Int(static_cast<int64_t>(LayoutDigest(plan)));
    w.Int(cache->valid && cache->world == world ? static_cast<int64_t>(cache->digest_of_all) : 0);
    w.Str(plan.temp_dir);
    EMBER_ASSIGN_OR_RETURN(std::vector<std::string> all,
                           AllGatherBytes(*pg, w.Take(), options.timeout, "checking the plan"));
    reused = cache->valid && cache->world == world;
    std::string temp_dir0;
    for (int r = 0; r < world && reused; ++r) {
      ByteReader in(all[r]);
      const auto digest = static_cast<uint64_t>(in.Int());
      const auto of_all = static_cast<uint64_t>(in.Int());
      const std::string dir = in.Str();
      if (r == 0) temp_dir0 = dir;
      reused =
          in.ok() && digest != 0 && digest == cache->digests[r] && of_all == cache->digest_of_all;
    }
    if (reused) {
      plans = cache->plans;
      plans[0].temp_dir = temp_dir0;
      global = cache->global;
      ++cache->hits;
    }
  }
  if (!reused) {
    if (pg == nullptr) {
      plans.push_back(plan);
    } else {
      EMBER_ASSIGN_OR_RETURN(std::vector<std::string> all,
                             AllGatherBytes(*pg, EncodePlan(plan), options.timeout, "planning"));
      for (int r = 0; r < world; ++r) {
        EMBER_ASSIGN_OR_RETURN(RankPlan p, DecodePlan(all[r], r));
        plans.push_back(std::move(p));
      }
    }
    for (int r = 0; r < world; ++r) {
      if (!plans[r].error.empty()) {
        if (cache != nullptr) cache->valid = false;
        return absl::InvalidArgumentError(absl::StrCat(
            "distributed checkpoint save to ", path, " failed on rank ", r, ": ", plans[r].error));
      }
    }
    absl::StatusOr<std::vector<Assignment>> planned = GlobalPlan(plans);
    if (!planned.ok()) {
      if (cache != nullptr) cache->valid = false;
      return planned.status();
    }
    global = *std::move(planned);
    if (cache != nullptr && pg != nullptr) {
      ++cache->misses;
      cache->valid = true;
      cache->world = world;
      cache->plans = plans;
      cache->global = global;
      cache->digests.clear();
      std::string all_digests;
      for (RankPlan& p : cache->plans) {
        p.temp_dir.clear();
        cache->digests.push_back(LayoutDigest(p));
        all_digests += absl::StrCat(cache->digests.back(), ",");
      }
      cache->digest_of_all = Fnv1a(all_digests);
      if (cache->digest_of_all == 0) cache->digest_of_all = 1;
    }
  }
  const std::string temp_dir = plans[0].temp_dir;
  const std::string id = temp_dir.substr(temp_dir.size() - 16);

  // 2. Write this rank's pieces into the temporary directory.
  absl::Status wrote = absl::OkStatus();
  std::vector<std::pair<size_t, ChunkMetadata>> chunks;
  {
    std::error_code ec;
    fs::create_directories(temp_dir, ec);
    if (ec && !fs::is_directory(temp_dir)) {
      wrote = absl::InternalError(
          absl::StrCat("cannot create directory ", temp_dir, ": ", ec.message()));
    }
  }
  if (wrote.ok()) {
    absl::StatusOr<std::vector<std::pair<size_t, ChunkMetadata>>> w =
        WritePieces(global, rank, temp_dir, plans[0].entries, pieces, options);
    if (w.ok()) {
      chunks = std::move(*w);
    } else {
      wrote = w.status();
    }
  }

  // 3. Every rank's outcome; rank 0 commits when all succeeded.
  std::vector<std::string> results;
  if (pg == nullptr) {
    results.push_back(EncodeResult(wrote, chunks));
  } else {
    EMBER_ASSIGN_OR_RETURN(results,
                           AllGatherBytes(*pg, EncodeResult(wrote, chunks), options.timeout,
                                          "collecting the written pieces"));
  }
  Metadata md;
  md.world_size = world;
  for (const EntryPlan& e : plans[0].entries) {
    md.tensors.push_back({e.key, TensorMetadata{e.dtype, e.global_shape, {}}});
  }
  std::vector<std::string> failures;
  for (int r = 0; r < world; ++r) {
    std::string error;
    std::vector<std::pair<size_t, ChunkMetadata>> rc;
    if (!DecodeResult(results[r], &error, &rc)) error = "its report arrived malformed";
    if (!error.empty()) {
      failures.push_back(absl::StrCat("rank ", r, ": ", error));
      continue;
    }
    for (auto& [k, ch] : rc) md.tensors[k].second.chunks.push_back(std::move(ch));
  }
  if (!failures.empty()) {
    if (rank == 0) {
      std::error_code ec;
      fs::remove_all(temp_dir, ec);
    }
    return absl::InternalError(absl::StrCat(
        "distributed checkpoint save to ", path,
        " failed; the previous checkpoint is unchanged: ", absl::StrJoin(failures, "; ")));
  }
  absl::Status committed = absl::OkStatus();
  if (rank == 0) {
    for (auto& [key, tm] : md.tensors) {
      std::sort(
          tm.chunks.begin(), tm.chunks.end(),
          [](const ChunkMetadata& a, const ChunkMetadata& b) { return a.offsets < b.offsets; });
    }
    committed = WriteFile(absl::StrCat(temp_dir, "/", kMetadataFileName), encode_metadata(md),
                          options.sync_files);
    if (committed.ok() && options.sync_files) committed = SyncDir(temp_dir);
    if (committed.ok()) committed = Commit(temp_dir, path, id, options.sync_files);
    if (committed.ok()) {
      RemoveStaleTempDirs(path);
      const std::string parent = fs::path(path).parent_path().string();
      if (options.sync_files) committed = SyncDir(parent.empty() ? "." : parent);
    } else {
      std::error_code ec;
      fs::remove_all(temp_dir, ec);
    }
  }
  if (pg == nullptr) return committed;
  // 4. Rank 0's outcome, so that every rank returns it.
  EMBER_ASSIGN_OR_RETURN(
      std::vector<std::string> outcome,
      AllGatherBytes(*pg, rank == 0 ? committed.ToString() : "", options.timeout, "committing"));
  if (rank == 0) return committed;
  if (outcome[0] != absl::OkStatus().ToString()) {
    return absl::InternalError(absl::StrCat("distributed checkpoint save to ", path,
                                            ": rank 0 could not commit: ", outcome[0]));
  }
  return absl::OkStatus();
}

absl::Status load(const StateDict& state_dict, const CheckpointOptions& options) {
  EMBER_ASSIGN_OR_RETURN(Metadata md, read_metadata(options.path));
  FileCache files(options.path);
  for (const auto& [key, item] : state_dict) {
    const TensorMetadata* tm = md.find(key);
    if (tm == nullptr) {
      return absl::NotFoundError(absl::StrCat(
          "distributed checkpoint ", options.path, " has no tensor \"", key, "\" (it has ",
          md.tensors.size(), " tensors", md.tensors.empty() ? "" : ", the first \"",
          md.tensors.empty() ? "" : md.tensors[0].first, md.tensors.empty() ? "" : "\"", ")"));
    }
    const Item host = OnHost(item, /*with_values=*/false);
    EMBER_ASSIGN_OR_RETURN(std::vector<Piece> pieces, Pieces(key, host));
    const SizeVector global = GlobalShape(item);
    if (global != tm->global_shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          "distributed checkpoint ", options.path, ": \"", key, "\" was saved with shape ",
          ShapeToString(tm->global_shape), " but is loaded as ", ShapeToString(global)));
    }
    for (const Piece& p : pieces) {
      EMBER_RETURN_IF_ERROR(LoadPiece(key, *tm, p.box, p.local, files));
    }
    if (!item.tensor.is_cpu()) item.tensor.detach().copy_(host.tensor);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::pair<std::string, Tensor>>> load_full_state_dict(
    const std::string& path, const std::vector<std::string>& keys) {
  EMBER_ASSIGN_OR_RETURN(Metadata md, read_metadata(path));
  FileCache files(path);
  std::vector<std::pair<std::string, Tensor>> out;
  std::vector<std::string> wanted = keys;
  if (wanted.empty()) {
    for (const auto& [k, tm] : md.tensors) wanted.push_back(k);
  }
  for (const std::string& key : wanted) {
    const TensorMetadata* tm = md.find(key);
    if (tm == nullptr) {
      return absl::NotFoundError(
          absl::StrCat("distributed checkpoint ", path, " has no tensor \"", key, "\""));
    }
    Tensor t = empty(tm->global_shape, tm->dtype);
    Box all{SizeVector(tm->global_shape.size(), 0), tm->global_shape};
    EMBER_RETURN_IF_ERROR(LoadPiece(key, *tm, all, t, files));
    out.emplace_back(key, std::move(t));
  }
  return out;
}

}  // namespace ember::distributed::checkpoint
