#!/usr/bin/env bash
# llama.cpp beside lode on the GPU machine, in the same call: a yardstick, not a dependency.
# Its tree comes from PyPI's llama-cpp-python sdist (vendor/llama.cpp, packed here without
# models/*.gguf, docs, benches as a .tar.xz and carried).
#   bash ci/llama-beside.sh build TARBALL   start the CUDA build (sm_90) in the background,
#                                           under setsid; log /tmp/llama/build.log (~4 min)
#   bash ci/llama-beside.sh bench FILE...   wait for it, then llama-bench -p 512 -n 128 -r 3
#                                           with flash attention and every layer on the GPU
#   PACK=1 bash ci/llama-beside.sh pack SDIST OUT.tar.xz   (here) pack the sdist's tree
set -uo pipefail
W=/tmp/llama
case "${1:-}" in
pack)
  t=$(mktemp -d); tar -xzf "$2" -C "$t"
  src=$(find "$t" -maxdepth 3 -type d -path '*vendor/llama.cpp' | head -1)
  rm -rf "$src"/models/*.gguf "$src"/docs "$src"/benches
  tar -C "$(dirname "$src")" -cJf "$3" llama.cpp && rm -rf "$t" && ls -la "$3" ;;
build)
  mkdir -p "$W" && tar -xJf "$2" -C "$W" || exit 1
  cd "$W/llama.cpp" || exit 1
  setsid bash -c 'cmake -B build -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF > ../build.log 2>&1 &&
    cmake --build build -j 15 --target llama-bench llama-batched-bench >> ../build.log 2>&1; echo "exit $?" > ../build.done' < /dev/null > /dev/null 2>&1 &
  echo "llama.cpp build started in $W" ;;
bench)
  shift
  for _ in $(seq 600); do [ -f "$W/build.done" ] && break; sleep 1; done
  if ! grep -q 'exit 0' "$W/build.done" 2>/dev/null; then echo "llama.cpp build failed or unfinished:"; tail -20 "$W/build.log"; exit 1; fi
  for f in "$@"; do
    echo "-- llama.cpp $(basename "$f")"
    "$W/llama.cpp/build/bin/llama-bench" -m "$f" -p 512 -n 128 -r 3 -ngl 99 -fa 1 2>&1 | grep -E '^\|' | grep -vE -- '---'
  done ;;
*) sed -n 2,9p "$0"; exit 2 ;;
esac
