#!/usr/bin/env bash
# Interleaved A/B of Go benchmarks at two revisions, for a shared, noisy
# machine: build the test binary of PKG at REV_A and at REV_B (git
# worktrees), then run them alternately ROUNDS times (A, B, A, B, ...), and
# print per benchmark the median and best cpu-ns/op (ns/op when the
# benchmark reports no cpu-ns/op) of each, and the median of the per-round
# ratios B/A. Only numbers from the same run are compared.
#
#   bench/ab.sh REV_A REV_B PKG [REGEX] [ROUNDS] [BENCHTIME]
#   bench/ab.sh 2115b47 HEAD ./hclock 'EnqueueDequeue|OnePort' 9 1000000x
#
# REV may be a commit, a branch, or "." for the work tree as it is.
set -euo pipefail
[ $# -ge 3 ] || { sed -n '2,12p' "$0" >&2; exit 2; }
a=$1 b=$2 pkg=$3 re=${4:-.} rounds=${5:-7} bt=${6:-1000000x}
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'cd "$root"; for w in "$tmp"/wt-*; do [ -d "$w" ] && git worktree remove --force "$w" >/dev/null 2>&1; done; rm -rf "$tmp"' EXIT
build() { # rev name
	local src=$root
	if [ "$1" != . ]; then
		src=$tmp/wt-$2
		git -C "$root" worktree add -q --detach "$src" "$1"
	fi
	(cd "$src" && go test -c -o "$tmp/$2.test" "$pkg")
}
build "$a" A
build "$b" B
dir=$root/${pkg#./}
for r in $(seq "$rounds"); do
	for v in A B; do
		(cd "$dir" && "$tmp/$v.test" -test.run '^$' -test.bench "$re" -test.benchtime "$bt" -test.count 1) |
			awk -v v=$v -v r=$r '/^Benchmark/ { x = $3; for (i = 4; i < NF; i++) if ($(i+1) == "cpu-ns/op") x = $i; print v, r, $1, x }'
	done
done >"$tmp/runs"
printf '%-44s %10s %10s %10s %10s %8s\n' benchmark "A median" "A best" "B median" "B best" "B/A"
awk '
function median(arr, n,   i, j, t) { for (i = 2; i <= n; i++) for (j = i; j > 1 && arr[j-1] > arr[j]; j--) { t = arr[j]; arr[j] = arr[j-1]; arr[j-1] = t } return n % 2 ? arr[(n+1)/2] : (arr[n/2] + arr[n/2+1]) / 2 }
{ v[$1, $3, ++n[$1, $3]] = $4; val[$1, $2, $3] = $4; names[$3] = 1; rounds[$2] = 1 }
END {
	for (name in names) {
		na = n["A", name]; nb = n["B", name]; ba = 1e18; bb = 1e18; k = 0
		for (i = 1; i <= na; i++) { xa[i] = v["A", name, i]; if (xa[i] < ba) ba = xa[i] }
		for (i = 1; i <= nb; i++) { xb[i] = v["B", name, i]; if (xb[i] < bb) bb = xb[i] }
		for (r in rounds) if (("A", r, name) in val && ("B", r, name) in val) rr[++k] = val["B", r, name] / val["A", r, name]
		printf "%-44s %10.1f %10.1f %10.1f %10.1f %8.2f\n", name, median(xa, na), ba, median(xb, nb), bb, median(rr, k)
	}
}' "$tmp/runs" | sort
