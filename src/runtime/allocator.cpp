#include "weave/runtime/allocator.hpp"

#include "weave/common/error.hpp"

namespace weave::runtime {

OffsetAllocator::OffsetAllocator(size_t capacity) : capacity_(capacity) {
  if (capacity) free_[0] = capacity;
}

std::map<size_t, size_t>::const_iterator OffsetAllocator::first_fit(size_t bytes, size_t align) const {
  WEAVE_CHECK(bytes > 0, "symmetric heap: zero-byte allocation");
  WEAVE_CHECK(align > 0 && (align & (align - 1)) == 0, "symmetric heap: alignment ", align, " is not a power of two");
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    const size_t start = (it->first + align - 1) & ~(align - 1);
    const size_t end = it->first + it->second;
    if (start < end && end - start >= bytes) return it;
  }
  return free_.end();
}

size_t OffsetAllocator::alloc(size_t bytes, size_t align) {
  auto it = first_fit(bytes, align);
  if (it != free_.end()) {
    const size_t start = (it->first + align - 1) & ~(align - 1);
    const size_t end = it->first + it->second;
    const size_t off = it->first;
    free_.erase(it);
    if (start > off) free_[off] = start - off;
    if (start + bytes < end) free_[start + bytes] = end - start - bytes;
    live_[start] = bytes;
    used_ += bytes;
    return start;
  }
  throw Error(detail::concat("weave: symmetric heap exhausted: ", bytes, " bytes requested, ", capacity_ - used_,
                             " of ", capacity_, " free (largest free range ", largest_free(),
                             "); raise CommOptions::heap_bytes or WEAVE_HEAP_BYTES"));
}

void OffsetAllocator::free(size_t offset) {
  auto it = live_.find(offset);
  WEAVE_CHECK(it != live_.end(), "symmetric heap: free of offset ", offset, " which is not allocated");
  size_t off = offset, sz = it->second;
  live_.erase(it);
  used_ -= sz;
  auto next = free_.lower_bound(off);
  if (next != free_.end() && off + sz == next->first) {
    sz += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      prev->second += sz;
      return;
    }
  }
  free_[off] = sz;
}

bool OffsetAllocator::fits(size_t bytes, size_t align) const { return first_fit(bytes, align) != free_.end(); }

size_t OffsetAllocator::largest_free() const {
  size_t m = 0;
  for (auto& [o, s] : free_) m = s > m ? s : m;
  return m;
}

bool OffsetAllocator::contains(size_t offset, size_t bytes) const {
  auto it = live_.upper_bound(offset);
  if (it == live_.begin()) return false;
  --it;
  return offset >= it->first && offset + bytes <= it->first + it->second;
}

}  // namespace weave::runtime
