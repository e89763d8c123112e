#!/usr/bin/env bash
# The GPU check: one command that verifies minimind-trl where its users train, on a lent GPU, in one device call.
#
#   bash benchmarks/gpu_check.sh [--cpu [--carried]] [--budget-s S] [--jobs N] [PART ...]
#
# Parts (default all, in this order): env bench precision logprobs zero fsdp qlora lora resume agent bench_compile
# (benchmarks/gpu_check.py --help says what each runs). Writes $OUT/gpu_check.json (the report, rewritten after each
# part) and $OUT/gpu_check.log (every part's output); OUT defaults to ./gpu_check_out. Needs no network. One check per
# OUT ($OUT/gpu_check.lock; a second is refused). Ctrl-C or SIGTERM stops the running parts with what they started and
# leaves the report of the parts finished, marked interrupted (exit 130 / 143).
#
# On a lent GPU: the wheels the machine lacks travel in .gpu-wheels/ (made here, with PyPI, by
# `bash benchmarks/gpu_wheels.sh`) and are installed there with --no-deps into a folder put first on PYTHONPATH; the
# repository itself goes on PYTHONPATH (nothing is pip-installed). One call of the device tool's `run`:
#
#   run(command="bash benchmarks/gpu_check.sh", carry=[".gpu-wheels"], timeout_s=600)
#
# and a fix re-checked with only the parts that failed, e.g. `bash benchmarks/gpu_check.sh zero bench`.
# --cpu: the same parts on CPU (the tests' bodies with MINIMIND_TEST_DEVICE=cpu, the benchmark at tiny sizes, its
# compiled variants compiled for the CPU, without CUDA graphs); tests/test_gpu_check.py runs its cheap parts in CI.
# --carried: with --cpu, install and use .gpu-wheels/ as on a lent GPU (the rehearsal, benchmarks/gpu_rehearsal.sh).
set -uo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
python="${PYTHON:-python3}"
case " $* " in
    *" --help "*|*" -h "*)
        sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
        exec "$python" benchmarks/gpu_check.py --help ;;
esac
export OUT="${OUT:-$repo/gpu_check_out}"
# OUT must be a folder this check can write, and no other check's: its lock (gpu_check.lock) is taken on descriptor 9,
# which the driver inherits and holds until it ends, however it ends; taken first, before the wheels' install folder
# is emptied. One line and exit 2 otherwise.
if ! mkdir -p "$OUT" 2> /dev/null || [ -L "$OUT/gpu_check.lock" ] || ! true 2> /dev/null >> "$OUT/gpu_check.lock"; then
    echo "gpu_check: error: OUT=$OUT: cannot write there (a file, a read-only folder or a link in the way);" \
        "set OUT to a folder of your own" >&2
    exit 2
fi
exec 9>> "$OUT/gpu_check.lock"
"$python" -c 'import sys; sys.path.insert(0, "benchmarks"); import gpu_check; sys.exit(gpu_check.take_lock(9, sys.argv[1]))' \
    "$OUT" || exit 2
export GPU_CHECK_LOCK_FD=9
cpu=0 carried=0 args=()
for arg in "$@"; do
    case "$arg" in
        --carried) carried=1 ;;  # the carried wheels also with --cpu (benchmarks/gpu_rehearsal.sh)
        --cpu) cpu=1; args+=("$arg") ;;
        *) args+=("$arg") ;;
    esac
done
[ "$cpu" = 0 ] && carried=1
wheels="${GPU_WHEELS_DIR:-.gpu-wheels}"  # as gpu_wheels.sh writes it
site_path=""
if [ "$carried" = 1 ] && compgen -G "$wheels/*.whl" > /dev/null; then
    site="${GPU_CHECK_SITE:-/tmp/gpu-check-site}"
    echo "installing $(ls "$wheels"/*.whl | wc -l) carried wheels into $site (--no-deps, no index)"
    rm -rf "$site"  # a wheel of another version must not leave its old metadata beside the new
    if ! "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
            "$wheels"/*.whl > "$OUT/pip_install.txt" 2>&1; then
        cat "$OUT/pip_install.txt" >&2
        echo "gpu_check: installing the carried wheels failed" >&2
        exit 3
    fi
    site_path="$site:"
    export GPU_CHECK_INSTALLED_SITE="$site"  # the env part checks the requirements of what it holds
elif [ "$carried" = 1 ]; then
    echo "no $wheels/ here: using the packages installed (bash benchmarks/gpu_wheels.sh makes the folder)"
    # a lent machine lacks these: stop now rather than fail every part on its import (carry=[".gpu-wheels"])
    if ! "$python" -c 'import datasets, deepspeed, trl' 2> "$OUT/imports.txt"; then
        tail -1 "$OUT/imports.txt" >&2
        echo "gpu_check: trl, datasets and deepspeed are needed: carry $wheels/ (bash benchmarks/gpu_wheels.sh)" >&2
        exit 3
    fi
fi
export PYTHONPATH="${site_path}$repo${PYTHONPATH:+:$PYTHONPATH}"
"$python" -c "import transformers, sys; print('transformers', transformers.__version__, 'from', transformers.__file__)"
exec "$python" benchmarks/gpu_check.py ${args[@]+"${args[@]}"}
