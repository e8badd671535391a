# Source this to run tokenmill and HF as on an AVX2-only CPU (Zen 3) on an AVX-512 host:
#   . ci/emulate_avx2/env.sh && .venv/bin/tokenmill bench latency --compare-hf
# The C kernels build for -march=znver3 (cc here) into their own cache; torch, oneDNN and MKL are
# held to AVX2; the CPU platform sees no AVX-512/AMX flags (sitecustomize.py). Not exact: the
# cores, caches and memory stay this host's. torch's bfloat16 oneDNN paths fail under it (torch
# still sees AVX-512), so bfloat16 tests are not meaningful here.
_here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export PYTHONPATH="$_here${PYTHONPATH:+:$PYTHONPATH}" CC="$_here/cc" TOKENMILL_CACHE="${TMPDIR:-/tmp}/tokenmill-avx2-emulation"
export ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2
