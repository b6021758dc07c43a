#!/usr/bin/env bash
# Strata demo: installs what is missing, builds, and trains the FedAvg 2NN
# (mlp) centrally on Fashion-MNIST for 5 epochs, printing per-epoch test
# accuracy; then evaluates the saved checkpoint.
# (The federated demo arrives with the coordinator and the edge client.)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" >/dev/null
DATA=${STRATA_DATA_DIR:-/usr/share/datasets/fashion-mnist}
out=${STRATA_DEMO_OUT:-out/demo}
mkdir -p "$out"
echo "== strata-tool info --model mlp"
./build/strata-tool info --model mlp
echo
echo "== strata-tool train --model mlp --epochs 5 (centralised)"
./build/strata-tool train --model mlp --data "$DATA" --epochs 5 --seed 1 \
    --out "$out/mlp.safetensors"
echo
echo "== strata-tool eval --model $out/mlp.safetensors"
./build/strata-tool eval --model "$out/mlp.safetensors" --data "$DATA"
