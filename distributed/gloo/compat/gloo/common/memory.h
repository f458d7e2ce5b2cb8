// Stand-in for gloo/common/memory.h, which Debian's libgloo-dev (0.0~git
// 20220518) leaves out although gloo/transport/tcp/pair.h includes it. Only
// pair_abort.cc sees it, searched after the system directories
// (-idirafter), so a libgloo that ships the real header wins.
//
// pair_abort.cc only calls an out-of-line member of tcp::Pair through a
// pointer gloo handed out; nothing here is constructed or laid out by Ember,
// so these wrappers only need to make the header parse. They box the same
// standard pointers gloo's do.
#ifndef EMBER_DISTRIBUTED_GLOO_COMPAT_GLOO_COMMON_MEMORY_H_
#define EMBER_DISTRIBUTED_GLOO_COMPAT_GLOO_COMMON_MEMORY_H_

#include <memory>

namespace gloo {

template <typename T>
class WeakNonOwningPtr;

template <typename T>
class NonOwningPtr final {
 public:
  NonOwningPtr() = default;
  explicit NonOwningPtr(const WeakNonOwningPtr<T>& weak) : ptr_(weak.ptr_.lock()) {}
  T* operator->() const noexcept { return ptr_.get(); }
  explicit operator bool() const noexcept { return static_cast<bool>(ptr_); }

 private:
  std::shared_ptr<T> ptr_;
};

template <typename T>
class WeakNonOwningPtr final {
 public:
  WeakNonOwningPtr() = default;
  NonOwningPtr<T> lock() const { return NonOwningPtr<T>(*this); }

 private:
  std::weak_ptr<T> ptr_;
  friend class NonOwningPtr<T>;
};

template <typename T>
class ShareableNonOwningPtr final {
 public:
  ShareableNonOwningPtr() = default;

 private:
  std::shared_ptr<T> ptr_;
};

}  // namespace gloo

#endif  // EMBER_DISTRIBUTED_GLOO_COMPAT_GLOO_COMMON_MEMORY_H_
