#!/usr/bin/env bash
# Download, here (with PyPI), the wheels that a lent GPU machine lacks, for its Python 3.12 on x86-64, into the
# git-ignored folder .gpu-wheels/ (about 30 MiB: it travels with the device call, whose whole working tree must
# stay under 64 MiB). `benchmarks/gpu_check.sh` installs them there with `pip install --no-index --no-deps` into a
# folder it puts first on PYTHONPATH.
#
# What the machine lacks (/work/.library/device/KINDS.md: its package list): trl, datasets and deepspeed, with the
# dependencies of these three that are not on it (dill, multiprocess, hjson, pydantic and its three, typing_extensions,
# regex), and bitsandbytes for the qlora part. transformers,
# peft and accelerate are there but at other versions: the pinned ones (.ci/constraints.txt) travel too. Everything
# else they need is on the image (huggingface_hub >= 1.31, tokenizers 0.23, safetensors 0.8, pyarrow, pandas, ...).
# DeepSpeed publishes a source archive only: its wheel is built here without its ops (DS_BUILD_OPS=0, pure Python),
# and DeepSpeed compiles the ops it needs there at first use (ninja and nvcc are on the machine).
#
#   bash benchmarks/gpu_wheels.sh            # into .gpu-wheels/ (emptied first)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
dest="${GPU_WHEELS_DIR:-$repo/.gpu-wheels}"
python="${PYTHON:-python3}"
pin() {  # the version .ci/constraints.txt pins
    local version
    version="$(sed -n "s/^$1==//p" "$repo/.ci/constraints.txt")"
    [ -n "$version" ] || { echo "no pin for $1 in .ci/constraints.txt" >&2; exit 1; }
    echo "$1==$version"
}
pinned=("$(pin transformers)" "$(pin trl)" "$(pin datasets)" "$(pin peft)" "$(pin accelerate)")
# dependencies missing on the image, at the versions this project's environment runs (datasets: dill<0.4.2,
# multiprocess<0.70.20; deepspeed: hjson, pydantic>=2), and typing_extensions, which pydantic_core 2.50 needs at >=4.16
# (the image's version is not recorded; seen importing with 4.16.0 under Python 3.12.1 here)
# and regex, which transformers checks at import (>=2025.10.22; the image's version is not recorded either)
extra=(dill==0.4.1 multiprocess==0.70.19 hjson==3.1.0 pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0
       typing-inspection==0.4.5 typing_extensions==4.16.0 regex==2026.12.2)
rm -rf "$dest"
mkdir -p "$dest"
"$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$dest" "${pinned[@]}" "${extra[@]}"
# DeepSpeed: sdist only on PyPI; build a pure-Python wheel (no ops) with the torch of this environment
build="$(mktemp -d)"
trap 'rm -rf "$build"' EXIT
DS_BUILD_OPS=0 "$python" -m pip wheel -q --no-deps --no-build-isolation -w "$build" "$(pin deepspeed)"
cp "$build"/deepspeed-*-py3-none-any.whl "$dest"/
# bitsandbytes (the qlora part): its wheel holds a library per CUDA and ROCm release (41 MiB); only the CUDA 13 ones,
# which the image's torch loads, and the CPU one travel (the others, and their RECORD lines, are dropped: 7 MiB)
"$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_24_x86_64 -d "$build" bitsandbytes==0.50.2
"$python" - "$build"/bitsandbytes-*.whl "$dest" <<'PY'
import os, re, sys, zipfile
source, dest = sys.argv[1], sys.argv[2]
dropped = re.compile(r"bitsandbytes/libbitsandbytes_(?!cuda13|cpu)[^/]*\.so$")
with zipfile.ZipFile(source) as whole, zipfile.ZipFile(os.path.join(dest, os.path.basename(source)), "w",
                                                       zipfile.ZIP_DEFLATED) as slim:
    for item in whole.infolist():
        if dropped.match(item.filename):
            continue
        data = whole.read(item)
        if item.filename.endswith(".dist-info/RECORD"):
            lines = data.decode().splitlines(keepends=True)
            data = "".join(line for line in lines if not dropped.match(line.split(",")[0])).encode()
        slim.writestr(item, data)
PY
count=$(ls "$dest"/*.whl | wc -l)
echo "$count wheels, $(du -sm "$dest" | cut -f1) MiB in $dest:"
ls "$dest"
