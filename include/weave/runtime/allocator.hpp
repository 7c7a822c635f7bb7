// First-fit sub-allocator over offsets of the symmetric heap. Deterministic: the same sequence of
// calls on every rank yields the same offsets, which is what makes allocation collective-free.
#pragma once
#include <cstddef>
#include <map>

namespace weave::runtime {

class OffsetAllocator {
 public:
  explicit OffsetAllocator(size_t capacity);
  // Throws weave::Error when no free range fits (message says how much is free).
  size_t alloc(size_t bytes, size_t align);
  void free(size_t offset);  // throws for an offset that is not allocated
  size_t capacity() const { return capacity_; }
  size_t used() const { return used_; }
  size_t largest_free() const;
  // Whether alloc(bytes, align) would succeed now: one free range holds it (the total free bytes
  // do not tell, on a fragmented heap).
  bool fits(size_t bytes, size_t align) const;
  // Whether one live allocation covers [offset, offset + bytes).
  bool contains(size_t offset, size_t bytes) const;
  // Whether a live allocation starts at `offset` (what free() takes).
  bool is_start(size_t offset) const { return live_.count(offset) != 0; }

 private:
  // The free range alloc takes for (bytes, align) (first fit), or free_.end().
  std::map<size_t, size_t>::const_iterator first_fit(size_t bytes, size_t align) const;
  size_t capacity_, used_ = 0;
  std::map<size_t, size_t> free_;  // offset -> size, coalesced
  std::map<size_t, size_t> live_;  // offset -> size
};

}  // namespace weave::runtime
