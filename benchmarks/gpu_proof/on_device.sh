#!/usr/bin/env bash
# On the lent GPU machine, one call per piece staged by prepare.sh (docs/gpu.md):
#   bash benchmarks/gpu_proof/on_device.sh K N
# stages piece K of N; after the last, runs the proof into $OUT (BUDGET seconds, default 500),
# reading the graphs compiled ahead where they came along.
set -euo pipefail
k=$1; n=$2
bash ".devwhl/p$k/install.sh" "$k" "$n"
[ "$k" -eq "$n" ] || exit 0
here=benchmarks/gpu_proof
export PYTHONPATH="$PWD/.devwhl/site:$PWD:$PWD/$here/stubs" PYTHONUNBUFFERED=1 MAX_SERVE_DISABLE_TELEMETRY=1
options=(--out "${OUT:-gpu-proof}" --budget "${BUDGET:-500}")
store=.precompiled/${ARCHITECTURE:-sm_90a}
if [ -f "$store.tar.xz" ]; then
  tar -C .precompiled -xJf "$store.tar.xz"
  options+=(--precompiled "$store")
fi
exec python3 "$here" "${options[@]}"
