#!/usr/bin/env bash
# check-standalone.sh -- fails when code or a script of this repository reads something outside the checkout
# (the team's old reference directory `../shared` beside it). Everything a test, tool or script reads lives in the
# repository: reference data in testdata/ (testdata/README.md), protocol references in docs/spec/ (issue #18).
#
# Scans the tracked files under crates/, scripts/ and .ci/ (all files when this is not a git checkout) for a path
# that leaves the repository towards `shared` in a line that is not a comment: `../shared`, `"shared/..."` or a
# `"shared"` path component. Comments are left alone (a stale citation is a docs problem, not a broken clone).
# Exit status: 0 clean, 1 with the offending lines listed.
#
# Usage: scripts/check-standalone.sh            (run by .ci/run before the build)
set -euo pipefail
cd "$(dirname "$0")/.."

if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    mapfile -t files < <(git ls-files -- crates scripts .ci)
else
    mapfile -t files < <(find crates scripts .ci -type f ! -path '*/target/*')
fi

self=scripts/check-standalone.sh
hits=()
for f in "${files[@]}"; do
    [ "$f" = "$self" ] && continue
    [ -f "$f" ] || continue
    # Binary files (pcaps and the like) cannot hold a path the code follows.
    grep -Iq . "$f" 2>/dev/null || continue
    while IFS= read -r line; do
        hits+=("$f:$line")
    done < <(grep -nE '\.\./shared([/"'"'"'`[:space:]]|$)|"shared(/|")' "$f" \
        | grep -vE '^[0-9]+:[[:space:]]*(//|#|/?\*|--)' || true)
done

if [ ${#hits[@]} -gt 0 ]; then
    echo "error: these lines read files outside the repository (../shared); put the file in testdata/ (with its" >&2
    echo "provenance in testdata/README.md) or the text in docs/spec/, and read it from there:" >&2
    printf '  %s\n' "${hits[@]}" >&2
    exit 1
fi
echo "check-standalone: no tracked file under crates/, scripts/ or .ci/ reads ../shared (${#files[@]} files)"
