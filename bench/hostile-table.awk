# The table of bench/storage-hostile.sh and bench/storage-hostile-guest.sh:
# from lines "before|ROUND|ATTACK|PERCENT" and "after|…", per attack each
# run's share of vm2's IOPS alone and their median, before and after.
function median(arr, n,   i, j, t) { for (i = 2; i <= n; i++) for (j = i; j > 1 && arr[j-1] > arr[j]; j--) { t = arr[j]; arr[j] = arr[j-1]; arr[j-1] = t } return n % 2 ? arr[(n+1)/2] : (arr[n/2] + arr[n/2+1]) / 2 }
{ k = $1 SUBSEP $3; x[k, ++n[k]] = $4; s[k] = s[k] (s[k] == "" ? "" : " ") $4; names[$3] = 1 }
END {
	printf "%-36s %-22s %-22s\n", "vm1 attack (vm2: % of alone)", "before: runs | median", "after: runs | median"
	for (a in names) {
		for (vi = 1; vi <= 2; vi++) {
			v = vi == 1 ? "before" : "after"; k = v SUBSEP a; m = n[k]
			for (i = 1; i <= m; i++) y[i] = x[k, i]
			out[vi] = sprintf("%s | %s", s[k], m ? median(y, m) : "-")
		}
		printf "%-36s %-22s %-22s\n", a, out[1], out[2]
	}
}
