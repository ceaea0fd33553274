#!/usr/bin/env bash
# make demo: validate and print every example policy with its entitlements.
set -euo pipefail
cd "$(dirname "$0")/.."
for f in examples/*.yaml; do
	echo "== $f"
	bin/sluice validate "$f"
done
