// FNV-1a over bytes: the one short, stable hash that names things across processes (a call's
// operator in the agreement's posts, test-case scopes, job ids, a candidate list), the same on
// every rank and build.
#pragma once
#include <cstdint>
#include <string_view>

namespace weave {

inline uint64_t fnv1a(std::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const char c : bytes) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  return h;
}

}  // namespace weave
