#!/bin/bash
# ab.sh: an interleaved A/B of outboxbench between two commits, on the same
# machine in one sitting (issue 34's rule: a heuristic stays only if it
# moves its row by at least 10 %).
#
#   bench/scripts/ab.sh A B N [outboxbench flags...]
#
# builds outboxbench at commits A and B (in temporary worktrees), then runs
# A, B, A, B, ... N times each with the given flags, each run writing its
# report to $AB_OUT/<commit>-<i>.md (default /tmp/ab). Compare the rows of
# the reports; run on a quiet machine (no builds or tests beside it).
# Example, the ordered rows on PostgreSQL, 3 pairs:
#   bench/scripts/ab.sh c0f71ba main 3 -only-ordered -db postgres -repeats 1
set -euo pipefail
[ $# -ge 3 ] || { sed -n '2,14p' "$0"; exit 2; }
a=$1 b=$2 n=$3; shift 3
root=$(git rev-parse --show-toplevel)
out=${AB_OUT:-/tmp/ab}
mkdir -p "$out"
work=$(mktemp -d)
trap 'for c in "$a" "$b"; do git -C "$root" worktree remove --force "$work/$c" 2>/dev/null || true; done; rm -rf "$work"' EXIT
for c in "$a" "$b"; do
	git -C "$root" worktree add -q --detach "$work/$c" "$c"
	(cd "$work/$c/bench" && go build -o "$work/outboxbench-$c" ./cmd/outboxbench)
done
for i in $(seq 1 "$n"); do
	for c in "$a" "$b"; do
		echo "run $i: $c"
		cp "$work/$c/BENCHMARKS.md" "$out/$c-$i.md" # the -only-* modes replace one section of -out
		(cd "$work/$c/bench" && "$work/outboxbench-$c" -out "$out/$c-$i.md" "$@")
	done
done
echo "reports in $out"
