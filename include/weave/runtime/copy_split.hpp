// How runtime::device_copy's threads share a copy (the kernel's and the CPU test's code): a byte
// head up to dst's next 16-byte boundary, 16-byte vectors, a byte tail; bytes only where dst and src
// are not on a common 16-byte grid. Thread t of `stride` takes every stride-th byte of the head and
// of the tail and every stride-th vector, so each byte is written once, by one thread.
#pragma once
#include <cstddef>
#include <cstdint>

#include "weave/common/host_device.hpp"

namespace weave::runtime {

struct CopySplit {
  size_t head;     // bytes before the first vector (all of them without a common grid)
  size_t vectors;  // 16-byte vectors from dst + head
  size_t tail;     // where the byte tail begins (head + 16 vectors)
};

WEAVE_HD inline CopySplit copy_split(uintptr_t dst, uintptr_t src, size_t bytes) {
  size_t head = (16 - (dst & 15)) & 15;
  if (((dst ^ src) & 15) != 0 || head > bytes) head = bytes;
  const size_t vectors = (bytes - head) / 16;
  return {head, vectors, head + vectors * 16};
}

// Thread t's part of the copy. `Vec` is a 16-byte type (uint4).
template <class Vec>
WEAVE_HD inline void copy_part(char* dst, const char* src, size_t bytes, size_t t, size_t stride) {
  static_assert(sizeof(Vec) == 16, "16-byte vectors");
  const CopySplit c = copy_split(reinterpret_cast<uintptr_t>(dst), reinterpret_cast<uintptr_t>(src), bytes);
  for (size_t i = t; i < c.head; i += stride) dst[i] = src[i];
  Vec* const dv = reinterpret_cast<Vec*>(dst + c.head);
  const Vec* const sv = reinterpret_cast<const Vec*>(src + c.head);
  for (size_t i = t; i < c.vectors; i += stride) dv[i] = sv[i];
  for (size_t i = c.tail + t; i < bytes; i += stride) dst[i] = src[i];
}

}  // namespace weave::runtime
