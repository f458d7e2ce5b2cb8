#include "data/record_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "tensor/factories.h"

namespace ember::data {
namespace {

constexpr char kMagic[8] = {'E', 'M', 'B', 'R', 'E', 'C', '0', '1'};
constexpr size_t kFooter = 24;
constexpr size_t kEntry = 24;

void Put64(uint64_t v, uint8_t* out) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(v >> (8 * i));
}

uint64_t Get64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

}  // namespace

// --- Writing ------------------------------------------------------------------

RecordWriter::RecordWriter(std::string path, FILE* file) : path_(std::move(path)), file_(file) {}

RecordWriter::RecordWriter(RecordWriter&& other) noexcept
    : path_(std::move(other.path_)),
      file_(std::exchange(other.file_, nullptr)),
      offset_(other.offset_),
      index_(std::move(other.index_)) {}

RecordWriter::~RecordWriter() {
  if (file_ != nullptr) {
    std::fclose(file_);
    std::remove((path_ + ".partial").c_str());
  }
}

absl::StatusOr<RecordWriter> RecordWriter::create(const std::string& path) {
  const std::string partial = path + ".partial";
  FILE* f = std::fopen(partial.c_str(), "wb");
  if (f == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("RecordWriter: cannot create ", partial, ": ", std::strerror(errno)));
  }
  RecordWriter w(path, f);
  if (std::fwrite(kMagic, 1, sizeof kMagic, f) != sizeof kMagic) {
    return absl::UnavailableError(absl::StrCat("RecordWriter: writing ", partial, " failed"));
  }
  w.offset_ = sizeof kMagic;
  return w;
}

absl::Status RecordWriter::append(std::string_view bytes, int64_t label) {
  if (file_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("RecordWriter: ", path_, " is closed; records go in before close()"));
  }
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), file_) != bytes.size()) {
    return absl::UnavailableError(absl::StrCat("RecordWriter: writing record ", size(), " to ",
                                               path_, ".partial failed: ", std::strerror(errno)));
  }
  index_.insert(index_.end(), {offset_, bytes.size(), static_cast<uint64_t>(label)});
  offset_ += bytes.size();
  return absl::OkStatus();
}

absl::Status RecordWriter::close() {
  if (file_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("RecordWriter: ", path_, " is closed"));
  }
  std::vector<uint8_t> tail(index_.size() * 8 + kFooter);
  for (size_t i = 0; i < index_.size(); ++i) Put64(index_[i], &tail[i * 8]);
  uint8_t* footer = &tail[index_.size() * 8];
  Put64(index_.size() / 3, footer);
  Put64(offset_, footer + 8);
  std::memcpy(footer + 16, kMagic, sizeof kMagic);
  const bool written = std::fwrite(tail.data(), 1, tail.size(), file_) == tail.size();
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  const std::string partial = path_ + ".partial";
  if (!written || !closed || std::rename(partial.c_str(), path_.c_str()) != 0) {
    std::remove(partial.c_str());
    return absl::UnavailableError(
        absl::StrCat("RecordWriter: finishing ", path_, " failed: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

// --- Reading ------------------------------------------------------------------

struct RecordDataset::Mapping {
  void* base = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (base != nullptr) ::munmap(base, size);
  }
};

absl::StatusOr<std::shared_ptr<RecordDataset>> RecordDataset::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(
        absl::StrCat("RecordDataset: cannot open ", path, ": ", std::strerror(errno)));
  }
  struct stat st;
  const bool stated = ::fstat(fd, &st) == 0;
  const size_t size = stated ? static_cast<size_t>(st.st_size) : 0;
  auto mapping = std::make_shared<Mapping>();
  if (size >= sizeof kMagic + kFooter) {
    void* base = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    if (base != MAP_FAILED) {
      mapping->base = base;
      mapping->size = size;
    }
  }
  ::close(fd);
  const auto* p = static_cast<const uint8_t*>(mapping->base);
  if (p == nullptr || std::memcmp(p, kMagic, sizeof kMagic) != 0 ||
      std::memcmp(p + size - sizeof kMagic, kMagic, sizeof kMagic) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("RecordDataset: ", path, " is not an Ember record file (", size,
                     " bytes, no EMBREC01 at its start and end); write one with RecordWriter or "
                     "//data:make_records"));
  }
  const uint64_t count = Get64(p + size - kFooter);
  const uint64_t index_at = Get64(p + size - kFooter + 8);
  if (index_at < sizeof kMagic || count > size / kEntry ||
      index_at + count * kEntry + kFooter != size) {
    return absl::DataLossError(absl::StrCat("RecordDataset: ", path,
                                            " is damaged: its footer "
                                            "says ",
                                            count, " records indexed at byte ", index_at, " of ",
                                            size));
  }
  std::shared_ptr<RecordDataset> ds(new RecordDataset());
  ds->path_ = path;
  ds->index_ = p + index_at;
  ds->count_ = static_cast<int64_t>(count);
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t at = Get64(ds->index_ + i * kEntry), length = Get64(ds->index_ + i * kEntry + 8);
    if (at < sizeof kMagic || at + length > index_at) {
      return absl::DataLossError(absl::StrCat("RecordDataset: ", path, " is damaged: record ", i,
                                              " (", length, " bytes at ", at,
                                              ") reaches past the records"));
    }
  }
  ds->mapping_ = std::move(mapping);
  return ds;
}

absl::StatusOr<std::string_view> RecordDataset::bytes(int64_t index) const {
  if (index < 0 || index >= count_) {
    return absl::OutOfRangeError(absl::StrCat(
        "RecordDataset: index ", index, " is out of range for a dataset of ", count_, " samples"));
  }
  const uint64_t at = Get64(index_ + index * kEntry);
  const uint64_t length = Get64(index_ + index * kEntry + 8);
  return std::string_view(static_cast<const char*>(mapping_->base) + at, length);
}

int64_t RecordDataset::label(int64_t index) const {
  return static_cast<int64_t>(Get64(index_ + index * kEntry + 16));
}

std::optional<Recipe> RecordDataset::recipe() const {
  return Recipe{"ember.data.RecordDataset", Sample(path_)};
}

namespace {

absl::StatusOr<std::shared_ptr<Dataset>> ReopenRecords(const Sample& args) {
  absl::StatusOr<std::string> path = args.as<std::string>();
  if (!path.ok()) return path.status();
  absl::StatusOr<std::shared_ptr<RecordDataset>> ds = RecordDataset::open(*path);
  if (!ds.ok()) return ds.status();
  return std::shared_ptr<Dataset>(*std::move(ds));
}
EMBER_REGISTER_DATASET_FACTORY("ember.data.RecordDataset", ReopenRecords);

}  // namespace

absl::StatusOr<Sample> RecordDataset::get(int64_t index) {
  absl::StatusOr<std::string_view> b = bytes(index);
  if (!b.ok()) return b.status();
  // A view of the mapping, which it keeps alive.
  std::shared_ptr<Mapping> keep = mapping_;
  Tensor t = from_blob(const_cast<char*>(b->data()), {static_cast<int64_t>(b->size())}, kUInt8,
                       [keep](void*) {});
  return Sample(Sample::List{Sample(std::move(t)), Sample(label(index))});
}

}  // namespace ember::data
