#!/usr/bin/env bash
# Fills fuzz/corpus/parse_frame (git-ignored) with seed inputs for the parse_frame target:
# the committed fuzz/seeds/* plus every frame of testdata/spec/vectors.pcap (the golden
# vectors). Safe to re-run.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="$here/corpus/parse_frame"
mkdir -p "$out"
cp "$here"/seeds/* "$out"/
vectors="$here/../testdata/spec/vectors.pcap"
if [ -f "$vectors" ]; then
    python3 - "$vectors" "$out" <<'PY'
import struct, sys
data = open(sys.argv[1], "rb").read()
magic = data[:4]
endian = "<" if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") else ">"
off, n = 24, 0
while off + 16 <= len(data):
    _, _, incl, _ = struct.unpack(endian + "IIII", data[off:off + 16])
    frame = data[off + 16:off + 16 + incl]
    off += 16 + incl
    n += 1
    with open(f"{sys.argv[2]}/vector-{n:02}", "wb") as f:
        f.write(frame)
print(f"{n} frames from {sys.argv[1]}")
PY
fi
echo "corpus: $(ls "$out" | wc -l) files in $out"
