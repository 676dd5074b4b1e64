// A 64-byte aligned, uninitialised float buffer owned by a unique_ptr. Allocation failure throws
// std::bad_alloc, which the API layer reports as ANYATTN_E_OUT_OF_MEMORY.
#ifndef ANYATTN_RUNTIME_ALIGNED_BUFFER_H_
#define ANYATTN_RUNTIME_ALIGNED_BUFFER_H_

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>

namespace anyattn::runtime {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

template <class T>
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(int64_t count) { allocate(count); }

  // Replaces the contents with `count` uninitialised elements (none for count <= 0).
  void allocate(int64_t count) {
    data_.reset();
    if (count <= 0) return;
    const uint64_t bytes = (static_cast<uint64_t>(count) * sizeof(T) + 63) / 64 * 64;
    if (bytes / sizeof(T) < static_cast<uint64_t>(count)) throw std::bad_alloc();
    void* p = std::aligned_alloc(64, bytes);
    if (p == nullptr) throw std::bad_alloc();
    data_.reset(static_cast<T*>(p));
  }
  T* get() const { return data_.get(); }

 private:
  std::unique_ptr<T, FreeDeleter> data_;
};

}  // namespace anyattn::runtime

#endif  // ANYATTN_RUNTIME_ALIGNED_BUFFER_H_
