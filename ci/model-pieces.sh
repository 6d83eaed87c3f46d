#!/usr/bin/env bash
# Bring a real GGUF to the GPU machine, which has no network and takes ≤ 64 MiB per call.
#   here:   bash ci/model-pieces.sh split FILE [NAME]   → carry/pieces/NAME.partNN (44 MiB each) + NAME.sha256
#   there:  bash ci/model-pieces.sh stash               (one call per piece, carrying that piece: copies
#                                                       carry/pieces/* to /tmp/pieces; < 30 s between calls)
#           bash ci/model-pieces.sh join NAME          → /tmp/NAME.gguf, sha256 checked (exit 1 on mismatch)
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  split)
    f=$2; name=${3:-$(basename "$f" .gguf)}; mkdir -p carry/pieces
    rm -f carry/pieces/"$name".part*
    split -b 44M -d "$f" carry/pieces/"$name".part
    sha256sum "$f" | cut -d' ' -f1 > carry/pieces/"$name".sha256
    ls carry/pieces/"$name".part* ;;
  stash)
    mkdir -p /tmp/pieces; cp -v carry/pieces/* /tmp/pieces/ ;;
  join)
    name=$2; cat /tmp/pieces/"$name".part* > /tmp/"$name".gguf
    want=$(cat /tmp/pieces/"$name".sha256); got=$(sha256sum /tmp/"$name".gguf | cut -d' ' -f1)
    [ "$want" = "$got" ] && echo "/tmp/$name.gguf: sha256 ok" || { echo "/tmp/$name.gguf: sha256 $got, expected $want"; exit 1; } ;;
  *) echo "usage: $0 split FILE [NAME] | stash | join NAME" >&2; exit 2 ;;
esac
