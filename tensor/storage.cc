#include "tensor/storage.h"

#include "tensor/error.h"

namespace ember {

Storage::Storage(DataPtr data, size_t nbytes, Allocator* allocator)
    : impl_(std::allocate_shared<Impl>(PoolAllocator<Impl>(),
                                       Impl{std::move(data), nbytes, allocator})) {}

Storage Storage::Allocate(size_t nbytes, Allocator* allocator) {
  EMBER_INTERNAL_ASSERT(allocator != nullptr);
  return Storage(allocator->Allocate(nbytes), nbytes, allocator);
}

DataPtr Storage::set_data_ptr(DataPtr data, Allocator* allocator) {
  EMBER_INTERNAL_ASSERT(impl_ != nullptr, "set_data_ptr on a null storage");
  DataPtr old = std::move(impl_->data);
  impl_->data = std::move(data);
  impl_->allocator = allocator;
  return old;
}

}  // namespace ember
