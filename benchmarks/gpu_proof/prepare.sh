#!/usr/bin/env bash
# Everything a lent GPU machine needs for `make gpu-proof`, made here (docs/gpu.md), from the project root:
#   bash benchmarks/gpu_proof/prepare.sh
# 1. MAX, its serving extra and the OpenAI client for Python 3.12, in pieces of at most 58 MiB
#    (.devwhl/p1 .. pN, by the workplace's shared/gpu/prepare.sh; SHARED_GPU names its folder);
# 2. the attention and LM graphs compiled for the GPU here, without one (--precompile), packed as
#    .precompiled/sm_90a.tar.xz (about 1 MB).
# Then prints the device calls to make, one per piece. Takes 15-25 minutes on 2 cores.
set -euo pipefail
[ -d .git ] || { echo "run this from the project root" >&2; exit 2; }
shared=${SHARED_GPU:-../shared/gpu}
here=benchmarks/gpu_proof
architecture=${ARCHITECTURE:-sm_90a}
grep -qx '/.devwhl/' .git/info/exclude 2>/dev/null || echo '/.devwhl/' >> .git/info/exclude
EXTRA_WHEELS="$(grep -v '^#' "$here/device-wheels.txt" | tr '\n' ' ')" bash "$shared/prepare.sh"
rm -rf ".precompiled/$architecture" ".precompiled/$architecture.tar.xz"
.venv/bin/python "$here" --precompile ".precompiled/$architecture" --architecture "$architecture"
tar -C .precompiled -cf - "$architecture" | xz -9 > ".precompiled/$architecture.tar.xz"
rm -rf ".precompiled/$architecture"
n=$(ls -d .devwhl/p[0-9]* | wc -l)
echo "device calls, one after another (a machine goes back after 30 s idle):"
for k in $(seq 1 "$n"); do
  carry="[\".devwhl/p$k\"]"
  [ "$k" -eq "$n" ] && carry="[\".devwhl/p$k\", \".precompiled/$architecture.tar.xz\"]"
  echo "  run(command=\"bash $here/on_device.sh $k $n\", carry=$carry, timeout_s=$([ "$k" -eq "$n" ] && echo 600 || echo 120))"
done
