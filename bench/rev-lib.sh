# Sourced by the benches that compare revisions: rev_src REV NAME prints
# the directory of REV's source tree, the work tree for "." (root), else a
# copy of REV's files in $tmp/src-NAME (git archive). Needs root and tmp.
rev_src() {
	if [ "$1" = . ]; then
		echo "$root"
		return
	fi
	local src=$tmp/src-$2
	mkdir -p "$src"
	git -C "$root" archive "$1" | tar -x -C "$src"
	echo "$src"
}
