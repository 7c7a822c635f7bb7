// How runtime::device_copy's threads share a copy (the kernel's and the CPU test's code): a byte
// head up to dst's next boundary of the copy's grain, units of the grain, a byte tail. The grain is
// the widest access (16, 8, 4, 2 or 1 bytes) on whose grid dst and src both lie after the same
// head, so a source off dst's 16-byte grid by 4 still moves 4-byte words, not bytes. Thread t of
// `stride` takes every stride-th byte of the head and of the tail and every stride-th unit, so each
// byte is written once, by one thread.
#pragma once
#include <cstddef>
#include <cstdint>

#include "weave/common/host_device.hpp"

namespace weave::runtime {

struct CopySplit {
  size_t grain;  // bytes per unit: 16, 8, 4, 2 or 1
  size_t head;   // bytes before the first unit
  size_t units;  // grain-byte units from dst + head
  size_t tail;   // where the byte tail begins (head + grain * units)
};

WEAVE_HD inline CopySplit copy_split(uintptr_t dst, uintptr_t src, size_t bytes) {
  const uintptr_t x = (dst ^ src) | 16;
  const size_t grain = static_cast<size_t>(x & (~x + 1));  // the lowest bit where they differ, at most 16
  size_t head = (grain - (dst & (grain - 1))) & (grain - 1);
  if (head > bytes) head = bytes;
  const size_t units = (bytes - head) / grain;
  return {grain, head, units, head + units * grain};
}

namespace copy_detail {
template <class U>
WEAVE_HD inline void units(char* dst, const char* src, size_t n, size_t t, size_t stride) {
  U* const d = reinterpret_cast<U*>(dst);
  const U* const s = reinterpret_cast<const U*>(src);
  for (size_t i = t; i < n; i += stride) d[i] = s[i];
}
}  // namespace copy_detail

// Thread t's part of the copy. `Vec` is a 16-byte type (uint4).
template <class Vec>
WEAVE_HD inline void copy_part(char* dst, const char* src, size_t bytes, size_t t, size_t stride) {
  static_assert(sizeof(Vec) == 16, "16-byte vectors");
  const CopySplit c = copy_split(reinterpret_cast<uintptr_t>(dst), reinterpret_cast<uintptr_t>(src), bytes);
  for (size_t i = t; i < c.head; i += stride) dst[i] = src[i];
  char* const d = dst + c.head;
  const char* const s = src + c.head;
  switch (c.grain) {
    case 16: copy_detail::units<Vec>(d, s, c.units, t, stride); break;
    case 8: copy_detail::units<uint64_t>(d, s, c.units, t, stride); break;
    case 4: copy_detail::units<uint32_t>(d, s, c.units, t, stride); break;
    case 2: copy_detail::units<uint16_t>(d, s, c.units, t, stride); break;
    default: copy_detail::units<char>(d, s, c.units, t, stride); break;
  }
  for (size_t i = c.tail + t; i < bytes; i += stride) dst[i] = src[i];
}

}  // namespace weave::runtime
