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
# AB_A_FLAGS and AB_B_FLAGS add flags to one side only: an old commit's
# outboxbench may lack a flag the new one needs to run the same rows.
# Example, the ordered rows on PostgreSQL, 3 pairs:
#   bench/scripts/ab.sh c0f71ba main 3 -only-ordered -db postgres -repeats 1
# The producer rows against 4764356 (MariaDB only, no -db flag there):
#   AB_B_FLAGS="-db mariadb -ordered=false -stats=false -rate=false -instances=false -inbox=false -delayed=false -connectors=false" \
#     bench/scripts/ab.sh 4764356 main 3 -systems 'hot path (,HTTP' -backlog 20000 -memory 0 -repeats 1
set -euo pipefail
[ $# -ge 3 ] || { sed -n '2,19p' "$0"; exit 2; }
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
	for side in A B; do
		c=$a extra=${AB_A_FLAGS:-}
		[ $side = B ] && c=$b extra=${AB_B_FLAGS:-}
		echo "run $i: $c"
		cp "$work/$c/BENCHMARKS.md" "$out/$c-$i.md" # the -only-* modes replace one section of -out
		# shellcheck disable=SC2086 # the extra flags are words
		(cd "$work/$c/bench" && "$work/outboxbench-$c" -out "$out/$c-$i.md" $extra "$@")
	done
done
echo "reports in $out"
