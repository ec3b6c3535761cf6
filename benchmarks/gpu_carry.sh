#!/usr/bin/env bash
# What benchmarks/gpu.sh needs on the GPU machine that its image lacks, built here for its Python (CPython 3.12,
# x86-64) as one archive to carry: pydantic (hetfed's config), and flwr + Ray for the `flower_sim` step (Flower's
# Simulation Engine next to hetfed's executors on the GPU).
#
# Ray's wheel (74 MB) is more than a device call carries (64 MiB with the working tree), so Ray is stripped of what
# a local cluster does not load (its Java jars, the dashboard's web client, rllib, serve, data, llm, tune, train)
# and the whole folder is packed with xz (~34 MB). Only the packages the image does not already hold are included
# (its list: /work/.library/device/KINDS.md). Checked: the same set built for CPython 3.11, beside only the image's
# packages, ran `python benchmarks/engines.py --cases cgau --engines flower` on this project's CPU; on an H100
# (results/gpu_h100_2026-11-27b) Ray started and Flower's ClientApps trained.
#
#     bash benchmarks/gpu_carry.sh            # writes .carry/site312.tar.xz (ignored by git)
#
# What the #74 call scripts (results/gpu_h200_2026-12-04c/call*.sh, benchmarks/pfllib_protocol.sh) carry instead —
# pydantic's wheels in .whl/ and Fashion-MNIST's four IDX files (Debian's dataset-fashion-mnist) in
# .data/fashion-mnist/, both ignored by git — is written by
#
#     LIGHT=1 bash benchmarks/gpu_carry.sh    # then the run tool's carry: [".whl", ".data"]
#
# and on the device (the `run` tool, carry [".carry"]):
#
#     tar xJf .carry/site312.tar.xz -C /tmp && export PYTHONPATH=/tmp/site312 && OUT=$OUT bash benchmarks/gpu.sh
set -eu
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
site=$work/site312
platforms=()
for p in manylinux2014_x86_64 manylinux_2_17_x86_64 manylinux_2_24_x86_64 manylinux_2_27_x86_64 manylinux_2_28_x86_64 \
         manylinux1_x86_64 manylinux_2_5_x86_64; do
    platforms+=(--platform "$p")
done
pydantic=(pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0)
for ignored in /.carry/ /.whl/ /.data/; do
    grep -qx "$ignored" .git/info/exclude 2>/dev/null || echo "$ignored" >> .git/info/exclude
done
if [ "${LIGHT:-0}" = 1 ]; then
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        "${platforms[@]}" -d .whl "${pydantic[@]}"
    [ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] || apt-get install -y -qq dataset-fashion-mnist
    mkdir -p .data/fashion-mnist && cp /usr/share/datasets/fashion-mnist/*-ubyte.gz .data/fashion-mnist/
    du -sh .whl .data
    exit 0
fi
python3 -m pip install -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
    --target "$site" \
    "${pydantic[@]}" flwr==1.42.0 ray==2.55.1 grpcio==1.85.3 grpcio-health-checking==1.81.1 protobuf==6.33.6 \
    cryptography==50.0.2 cffi==2.1.1 pycparser pycryptodome==3.24.1 iterators==0.0.2 tomli tomli-w \
    jsonschema jsonschema-specifications referencing rpds-py sqlalchemy==2.1.9 greenlet alembic mako \
    fastapi==0.138.2 starlette==1.3.1
rm -rf "$site"/ray/jars "$site"/ray/dashboard/client/build "$site"/ray/{rllib,serve,data,llm,tune,train} "$site"/bin
find "$site" -name __pycache__ -prune -exec rm -rf {} +
mkdir -p .carry
tar cf - -C "$work" site312 | xz -9e -T0 > .carry/site312.tar.xz
ls -l .carry/site312.tar.xz
