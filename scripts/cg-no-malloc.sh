#!/usr/bin/env bash
# Instructions of one overhead-bench case under callgrind, in all and without glibc's
# allocator (every function of malloc.c left out), so that a change of allocation size
# class, which moves the allocator's own work, can be told from a change of this crate's.
#
# Usage: scripts/cg-no-malloc.sh <overhead-bench-binary> <case> <requests>
#   e.g. scripts/cg-no-malloc.sh target/release/deps/overhead-<hash> get/ours_never 20000
# Prints "<total> <total without malloc.c>". Per request: run at 20000 and 10000 and divide
# the difference by 10000 (BENCHMARKS.md, section 1).
set -eu
bin=$1
case=$2
n=$3
out=$(mktemp)
trap 'rm -f "$out"' EXIT
OVERHEAD_PROFILE=$case OVERHEAD_PROFILE_N=$n \
    valgrind --tool=callgrind --callgrind-out-file="$out" "$bin" >/dev/null 2>&1
callgrind_annotate --threshold=100 "$out" | python3 -c '
import re, sys
total = allocator = 0
for line in sys.stdin:
    m = re.match(r"\s*([\d,]+)\s+(?:\(.*?\)\s+)?(.*)$", line)
    if not m:
        continue
    count, name = int(m.group(1).replace(",", "")), m.group(2)
    if "PROGRAM TOTALS" in name:
        total = count
    elif "/malloc/" in name:
        allocator += count
print(total, total - allocator)
'
