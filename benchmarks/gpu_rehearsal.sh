#!/usr/bin/env bash
# The GPU check's rehearsal, here, before a loan: the lent machine's Python (3.12), its torch (2.11, the CUDA build
# from PyPI, ~4.6 GB, run on the CPU), the versions its image was recorded with (benchmarks/gpu_image.txt), the
# carried wheels installed as gpu_check.sh installs them there (--no-deps, first on PYTHONPATH), and the check's CPU
# form on top. It finds what a first GPU call would otherwise find: a package the image lacks, a requirement it does
# not meet, code that needs another Python or torch. CUDA itself it cannot rehearse.
#
#   bash benchmarks/gpu_wheels.sh                          # once: the wheels that travel (.gpu-wheels/)
#   PYTHON312=/path/to/python3.12 bash benchmarks/gpu_rehearsal.sh [PART ...]
#
# The environment lives in the git-ignored .gpu-rehearsal/ and is reused; OUT (default .gpu-rehearsal/out) gets the
# report and the log as on the GPU.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
fail() { echo "gpu_rehearsal: $*" >&2; exit 2; }
python312="${PYTHON312:-$(command -v python3.12 || true)}"
[ -n "$python312" ] || fail "no python3.12 (set PYTHON312): the lent machine runs Python 3.12"
compgen -G "${GPU_WHEELS_DIR:-.gpu-wheels}/*.whl" > /dev/null || fail "no carried wheels: bash benchmarks/gpu_wheels.sh"
home="$repo/.gpu-rehearsal"
venv="$home/venv"
[ -x "$venv/bin/python" ] || "$python312" -m venv "$venv"
"$venv/bin/python" -c 'import sys; assert sys.version_info[:2] == (3, 12)' || fail "$venv is not Python 3.12"
grep -v '^#' benchmarks/gpu_image.txt | grep -v '^$' > "$home/image-requirements.txt"
"$venv/bin/python" -m pip install -q -r "$home/image-requirements.txt"
absent="$(sed -n 's/^# absent \([a-z]\)/\1/p' benchmarks/gpu_image.txt)"
# shellcheck disable=SC2086  # a list of names
"$venv/bin/python" -m pip uninstall -q -y $absent 2> /dev/null || true
export OUT="${OUT:-$home/out}" GPU_CHECK_SITE="$home/site"
rm -rf "$GPU_CHECK_SITE"
PYTHON="$venv/bin/python" exec bash benchmarks/gpu_check.sh --cpu --carried "$@"
