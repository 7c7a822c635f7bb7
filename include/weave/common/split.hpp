// The near-equal split of n items over `parts` (ranks, chunks): part i gets n / parts items, and
// the first n % parts parts one more. Shards of collectives, TP rows, ring chunks and Ulysses rows
// all follow it, so every layer agrees on who owns what.
#pragma once
#include "weave/common/host_device.hpp"

namespace weave {

// Part i's first item and count.
template <class T>
struct Part {
  T begin, size;
};

template <class T>
WEAVE_HD inline Part<T> near_equal_part(T n, int parts, int i) {
  const T q = n / parts, rem = n % parts;
  return {i * q + (i < rem ? T(i) : rem), q + (i < rem ? T(1) : T(0))};
}

}  // namespace weave
