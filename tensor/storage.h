// Storage: reference-counted bytes that tensors view.
//
// Several tensors (views) share one Storage; copying a Storage copies the
// handle, not the bytes. The bytes come from an Allocator (or from caller
// memory through a DataPtr with its own deleter), and can be swapped for a
// different allocation of the same size with set_data_ptr(), which is how
// share_memory_() moves a live storage into shared memory without touching
// the tensors that view it.
//
//   ```cpp
//   #include "tensor/storage.h"
//   ember::Storage s = ember::Storage::Allocate(1024, ember::GetCpuAllocator());
//   ember::Storage alias = s;       // same bytes
//   if (s.use_count() != 2) return absl::InternalError("the handle was not shared");
//   ```
//
// Thread-safety: handles may be copied across threads; the bytes themselves
// are not synchronised.
#ifndef EMBER_TENSOR_STORAGE_H_
#define EMBER_TENSOR_STORAGE_H_

#include <cstddef>
#include <memory>

#include "tensor/allocator.h"

namespace ember {

class Storage {
 public:
  // A null storage (no bytes, no allocator).
  Storage() = default;
  // Takes ownership of `data`, which holds `nbytes`. `allocator` (may be null)
  // records where the memory came from.
  Storage(DataPtr data, size_t nbytes, Allocator* allocator = nullptr);

  // `nbytes` fresh bytes from `allocator`.
  static Storage Allocate(size_t nbytes, Allocator* allocator);

  bool defined() const { return impl_ != nullptr; }
  void* data() const { return impl_ ? impl_->data.get() : nullptr; }
  size_t nbytes() const { return impl_ ? impl_->nbytes : 0; }
  Device device() const { return impl_ ? impl_->data.device() : kCPU; }
  Allocator* allocator() const { return impl_ ? impl_->allocator : nullptr; }
  const DataPtr& data_ptr() const { return impl_->data; }

  // Replaces the allocation (same size, already holding the wanted bytes);
  // every tensor viewing this storage sees the new memory. Returns the old
  // allocation, which the caller may free or keep.
  DataPtr set_data_ptr(DataPtr data, Allocator* allocator);

  // Number of handles sharing these bytes.
  long use_count() const { return impl_.use_count(); }
  bool is_alias_of(const Storage& other) const { return impl_ == other.impl_; }
  // Identity of the shared bytes, stable for the storage's lifetime.
  const void* id() const { return impl_.get(); }

 private:
  struct Impl {
    DataPtr data;
    size_t nbytes = 0;
    Allocator* allocator = nullptr;
  };
  std::shared_ptr<Impl> impl_;
};

}  // namespace ember

#endif  // EMBER_TENSOR_STORAGE_H_
