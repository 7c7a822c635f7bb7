#!/usr/bin/env bash
# Packs what a GPU machine needs to run this build's tests and benchmarks without building:
# build/bin (stripped) and the CTest files, as .carry/build.tar.xz (git-ignored; the device tool
# carries at most 64 MiB, the repository's tracked files included). On the GPU machine, from the
# checkout's root:
#   tar xJf .carry/build.tar.xz && scripts/device-check.sh tests
# (the CTest files name this machine's build path; device-check.sh links it to the checkout).
#   scripts/pack-build.sh --ctest-only [BUILD]
# packs the CTest files alone as .carry/build-ctest.tar.xz (a few KB): what mutate.py --from-stash
# needs beside a stash that holds every binary its checks run (two-gpu-session.sh's races steps).
set -euo pipefail
cd "$(dirname "$0")/.."
ctest_only=0
[ "${1:-}" = --ctest-only ] && { ctest_only=1; shift; }
src=${1:-build}
out=.carry/build.tar.xz
[ "$ctest_only" = 1 ] && out=.carry/build-ctest.tar.xz
rm -rf .carry/build && mkdir -p .carry/build
(cd "$src" && find . -name 'CTestTestfile.cmake' -print0 | xargs -0 -I{} cp --parents {} ../.carry/build/)
if [ "$ctest_only" = 0 ]; then
  mkdir -p .carry/build/bin
  cp "$src"/bin/* .carry/build/bin/
  strip .carry/build/bin/* 2>/dev/null || true
fi
tar -C .carry -cf - build | xz -T0 -6 > "$out"
rm -rf .carry/build
du -sh "$out"
