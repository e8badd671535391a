#!/usr/bin/env bash
# The accelerator check for a CUDA machine without network access (about 8 minutes on an H200).
#
# 1. a venv over the machine's own torch/triton/transformers (--system-site-packages), the wheels
#    carried in .gpu-wheels/ (made here by `make gpu-wheels`) installed offline, and this repository's
#    distributions installed editable without dependencies or build isolation;
# 2. ci/gpu_check.py: the GPU test lane, Triton attention compiled on the GPU, greedy parity with
#    transformers with decode graphs on and off, and throughput in float16/bfloat16, graphs on and off.
#
# Writes gpu_check.json (and the steps' output) to $OUT when set; exits non-zero if anything failed.
# Arguments are passed on to ci/gpu_check.py (e.g. --dry-run to try it on a CPU).
set -uo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
VENV="${GPU_CHECK_VENV:-${TMPDIR:-/tmp}/tokenmill-gpu-venv}"
DISTS=(core platforms/cuda attention_backends/triton quantization/gguf quantization/gptq quantization/awq
       quantization/fp8 quantization/int8 plugins/testkit)
setup="ok"

say() { echo "[gpu_check] $*"; }

started=$(date +%s)
# no pip or setuptools of its own: the machine's pip installs into it, the carried setuptools builds
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv --system-site-packages --without-pip "$VENV" || setup="failed: could not create the venv at $VENV"
fi
# --system-site-packages reaches only the base interpreter's packages: when $PYTHON is itself a venv
# (the GPU image's python3 is), the folders holding its packages come along through a .pth file
if [ "$setup" = "ok" ]; then
  parent_sites=$("$PYTHON" -c "import sys; print([p for p in sys.path if p.endswith('-packages')])")
  child_site=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  echo "import site; list(map(site.addsitedir, $parent_sites))" > "$child_site/_gpu_check_parent.pth"
fi
if [ "$setup" = "ok" ]; then
  shopt -s nullglob
  wheels=(.gpu-wheels/*.whl)
  if [ ${#wheels[@]} -eq 0 ]; then
    say "no wheels in .gpu-wheels/: run 'make gpu-wheels' on a machine with PyPI access and carry .gpu-wheels"
    setup="failed: no .gpu-wheels"
  elif ! "$VENV/bin/python" -m pip install -q --no-index --no-deps --no-compile --disable-pip-version-check \
      "${wheels[@]}"; then
    setup="failed: installing .gpu-wheels"
  fi
  editable=()
  for dist in "${DISTS[@]}"; do editable+=(-e "$dist"); done
  if ! "$VENV/bin/python" -m pip install -q --no-index --no-deps --no-build-isolation --disable-pip-version-check \
      "${editable[@]}"; then
    setup="failed: installing this repository's distributions"
  fi
fi
say "setup: $setup ($(( $(date +%s) - started )) s)"

runner="$VENV/bin/python"
[ -x "$runner" ] || runner="$PYTHON"
"$runner" -c "import torch; print('[gpu_check] torch', torch.__version__, 'cuda', torch.version.cuda, \
'device', torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)"
export PYTHONUNBUFFERED=1
exec "$runner" ci/gpu_check.py --setup "$setup" "$@"
