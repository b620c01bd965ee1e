#!/usr/bin/env bash
# The GPU suite on a machine with a GPU and a CUDA torch that reaches no package index (a lent GPU machine).
#
#   .ci/gpu-suite.sh OUT [gpu-suite options: --apex-src DIR --emulated STORE --repro FILE ...]
#
# Installs this checkout offline into the Python that holds torch ($PYTHON, default python3: editable, no
# dependencies, no build isolation, nothing downloaded), puts that Python first on PATH, keeps the kernel cache
# in .gpu-cache/ inside the checkout (ignored; a second call on the same machine reuses it), runs
# `syncbn-harness gpu-suite --out OUT` under an overall limit ($SYNCBN_HARNESS_GPU_BUDGET_S, default 450 s, plus
# 60 s to stop and pack), and leaves at most eight files in OUT whatever happens (see docs/gpu-suite.md).
# Exit: the suite's (0 passed, 1 a step did not pass, 3 cannot run here), 3 when the install fails, 124 when the
# overall limit stopped it.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: .ci/gpu-suite.sh OUT [gpu-suite options]}
shift
mkdir -p "$out"
out=$(cd "$out" && pwd)
console="$out/console.txt"
: >"$console"
say() { echo "[gpu-suite.sh] $*" | tee -a "$console"; }
left_no_steps() {  # the suite did not get far enough to write its own steps.json
  [ -s "$out/steps.json" ] || printf '{"steps": [], "error": "%s"}\n' "$1" >"$out/steps.json"
}

py=$(command -v "${PYTHON:-python3}") || { say "no ${PYTHON:-python3} on PATH"; left_no_steps "no python"; exit 3; }
py=$("$py" -c 'import sys; print(sys.executable)')
export PATH="$(dirname "$py"):$PATH"
export SYNCBN_HARNESS_CACHE=${SYNCBN_HARNESS_CACHE:-$PWD/.gpu-cache}
export PYTHONUNBUFFERED=1
if [ -z "${CUDA_HOME:-}" ] && [ -x /usr/local/cuda/bin/nvcc ]; then
  export CUDA_HOME=/usr/local/cuda
fi
budget=${SYNCBN_HARNESS_GPU_BUDGET_S:-450}

say "python $py; cache $SYNCBN_HARNESS_CACHE; CUDA_HOME ${CUDA_HOME:-unset}; budget ${budget}s"
t0=$SECONDS
if ! "$py" -m pip install --quiet --no-index --no-deps --no-build-isolation --disable-pip-version-check \
    -e . >>"$console" 2>&1; then
  say "the offline install of this checkout failed (pip's output is above)"
  left_no_steps "the offline install failed"
  exit 3
fi
say "installed offline in $((SECONDS - t0))s"

timeout --signal=TERM --kill-after=30 "$((budget + 60))" "$py" -m harness gpu-suite --out "$out" \
  --budget "$budget" "$@"
code=$?
[ "$code" -eq 124 ] && say "stopped at the overall limit of $((budget + 60))s"
left_no_steps "the suite ended (exit $code) before writing its steps"
exit "$code"
