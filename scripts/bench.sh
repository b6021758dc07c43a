#!/usr/bin/env bash
# Benchmarks (not part of the tests). Builds in Release, then runs:
#   training throughput: mlp, cnn and resnet (STRATA_BENCH_MODELS), batch 32, 1 and
#   2 threads (STRATA_BENCH_THREADS), median of STRATA_BENCH_REPS (default 5)
#   repetitions; when Debian's python3-torch is installed (scripts/setup.sh
#   --bench), PyTorch on the same data, interleaved with Strata's runs, and
#   the median ratio Strata / PyTorch; also Strata's reference kernels
#   (OpenBLAS sgemm, im2col) instead of oneDNN. With PyTorch, resnet is
#   first checked to be the same model: a Strata checkpoint (one short
#   epoch) loads into tests/bench/torch_train.py's ResNet with
#   load_state_dict(strict=True) and gives the same test accuracy and loss.
#   payload: bytes per kept element and encode/decode throughput of the codec
#   at 1% density on a 1,000,000-element Gaussian tensor.
#   topk: top-k + error feedback at 1% density on 25,000,000 elements, 1 and
#   2 threads, against memcpy bandwidth measured in the same run.
#   memory: peak RSS of strata-server in one FedAvg round (mlp) with 10 and 200
#   synthetic clients, dense and uniform 1% (tests/bench/coordinator_memory.sh).
#   load: 1000 simulated clients x 3 rounds against one strata-server (mlp,
#   uniform 1%; LOAD_MODEL, LOAD_DENSITY, LOAD_CLIENTS, LOAD_MODE override):
#   uploads/s, p50/p99/p99.9 latency, errors, coordinator CPU per upload and
#   peak RSS; median and spread of 3 runs; then an open-loop sweep (offered
#   rates LOAD_RATES, default 1000 2000 4000 6000 8000: achieved rate,
#   p50/p99, the knee). With LOAD_BASELINE_REV=REV, REV's strata-server is
#   built too and runs alternately with this build's, with the ratio new/old
#   (tests/bench/load.sh, build/bench_load).
#   sim: strata-sim with 100 clients, 10 per round, 20 rounds (mlp, Dirichlet
#   0.5, uniform 1%): wall time and peak RSS of strata-sim, the coordinator,
#   the largest trained and the largest idle client; median of 3 runs
#   (tests/bench/sim_scale.sh).
#   replicas: 1000 simulated clients x 4 rounds through HAProxy to three
#   coordinators on one PostgreSQL store, against one on SQLite: uploads/s,
#   p99, errors, CPU per upload of the leader, the followers, HAProxy and
#   PostgreSQL; median and spread of 3 runs (tests/bench/replicas.sh).
# Usage: scripts/bench.sh [all|train|payload|topk|memory|load|sim|replicas]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" >/dev/null
DATA=${STRATA_DATA_DIR:-/usr/share/datasets/fashion-mnist}
what=${1:-all}

field() { printf '%s' "$1" | grep -o "\"$2\":[^,}]*" | cut -d: -f2; }

have_torch=0
if /usr/bin/python3 -c "import torch" >/dev/null 2>&1; then have_torch=1; fi

if [ "$what" = all ] || [ "$what" = train ]; then
    reps=${STRATA_BENCH_REPS:-5}
    echo "== training throughput (images/s, batch 32, real Fashion-MNIST images;" \
        "median of $reps interleaved runs)"
    if [ $have_torch = 0 ]; then
        echo "(python3-torch is not installed: no PyTorch baseline in this run;" \
            "scripts/setup.sh --bench installs it)"
    fi
    # When the environment pins OpenBLAS's kernel (OPENBLAS_CORETYPE), also
    # measure with OpenBLAS's own CPU detection, for this command alone.
    auto=0
    if [ -n "${OPENBLAS_CORETYPE:-}" ]; then auto=1; fi
    median() { tr ' ' '\n' | awk 'NF' | sort -g | awk '{ v[NR] = $1 }
        END { if (NR == 0) print "-"; else if (NR % 2) print v[(NR + 1) / 2];
              else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
    # Median of the per-repetition ratios of two lists ("-" when one is
    # empty): each pair ran back to back, under the same load.
    ratio() { awk -v a="$1" -v b="$2" 'BEGIN { n = split(a, x, " "); m = split(b, y, " ");
        if (n == 0 || n != m) { print "-"; exit }
        for (i = 1; i <= n; i++) r[i] = x[i] / y[i];
        for (i = 2; i <= n; i++) for (j = i; j > 1 && r[j - 1] > r[j]; j--) {
            t = r[j]; r[j] = r[j - 1]; r[j - 1] = t }
        printf "%.2f", n % 2 ? r[(n + 1) / 2] : (r[n / 2] + r[n / 2 + 1]) / 2 }'; }
    models=${STRATA_BENCH_MODELS:-mlp cnn resnet}
    if [ $have_torch = 1 ] && [[ " $models " == *" resnet "* ]]; then
        tmp=$(mktemp -d)
        ./build/strata-tool train --model resnet --data "$DATA" --epochs 1 --limit 2000 \
            --threads 1 --out "$tmp/resnet.safetensors" >/dev/null 2>&1
        s=$(./build/strata-tool eval --model "$tmp/resnet.safetensors" --data "$DATA" --json 2>/dev/null)
        t=$(cd tests/bench && /usr/bin/python3 torch_check.py --checkpoint "$tmp/resnet.safetensors" \
            --data "$DATA")
        rm -rf "$tmp"
        echo "resnet in PyTorch (strict load of a Strata checkpoint): test accuracy" \
            "$(field "$t" accuracy) vs Strata $(field "$s" test_accuracy), loss" \
            "$(field "$t" loss) vs $(field "$s" test_loss)"
        if ! awk -v a="$(field "$t" loss)" -v b="$(field "$s" test_loss)" \
            'BEGIN { d = a - b; exit !(d < 1e-4 && d > -1e-4) }'; then
            echo "resnet: PyTorch and Strata disagree on the same checkpoint" >&2
            exit 1
        fi
    fi
    printf '%-6s %-8s %12s %12s %8s %14s %8s' model threads strata pytorch ratio \
        "strata(ref)" "onednn/ref"
    if [ $auto = 1 ]; then printf ' %14s %8s' "strata(auto)" "ratio"; fi
    printf '\n'
    for model in $models; do
        for threads in ${STRATA_BENCH_THREADS:-1 2}; do
            s_all="" t_all="" r_all="" a_all=""
            # One repetition runs every variant once, in turn, so that load
            # from other processes falls on all of them alike.
            for _ in $(seq "$reps"); do
                s=$(./build/bench_train --model $model --threads $threads --batch 32 --data "$DATA")
                s_all="$s_all $(field "$s" images_per_second)"
                if [ $have_torch = 1 ]; then
                    t=$(/usr/bin/python3 tests/bench/torch_train.py --model $model \
                        --threads $threads --batch 32 --data "$DATA")
                    t_all="$t_all $(field "$t" images_per_second)"
                fi
                r=$(./build/bench_train --model $model --threads $threads --batch 32 \
                    --data "$DATA" --kernels reference)
                r_all="$r_all $(field "$r" images_per_second)"
                if [ $auto = 1 ]; then
                    a=$(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE ./build/bench_train \
                        --model $model --threads $threads --batch 32 --data "$DATA")
                    a_all="$a_all $(field "$a" images_per_second)"
                fi
            done
            sips=$(echo "$s_all" | median)
            tips=$(echo "$t_all" | median)
            rips=$(echo "$r_all" | median)
            printf '%-6s %-8s %12.0f %12s %8s %14s %8s' $model $threads "$sips" \
                "$(printf '%s' "$tips" | awk '{ if ($1 == "-") print; else printf "%.0f", $1 }')" \
                "$(ratio "$s_all" "$t_all")" \
                "$(printf '%s' "$rips" | awk '{ if ($1 == "-") print; else printf "%.0f", $1 }')" \
                "$(ratio "$s_all" "$r_all")"
            if [ $auto = 1 ]; then
                aips=$(echo "$a_all" | median)
                printf ' %14.0f %8s' "$aips" "$(ratio "$a_all" "$t_all")"
            fi
            printf '\n'
        done
    done
    echo "(ratio: median of the per-repetition ratios Strata / PyTorch; strata(ref): Strata's" \
        "reference kernels (OpenBLAS sgemm, im2col for convolutions) instead of oneDNN," \
        "onednn/ref likewise)"
    if [ $auto = 1 ]; then
        echo "(strata(auto): the same run with OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE} unset)"
    fi
fi

if [ "$what" = all ] || [ "$what" = payload ]; then
    echo "== payload codec"
    ./build/bench_payload
    ./build/bench_payload 1234 0.01
fi

if [ "$what" = all ] || [ "$what" = topk ]; then
    echo "== top-k + error feedback"
    for threads in 1 2; do
        ./build/bench_topk --threads $threads
    done
fi

if [ "$what" = all ] || [ "$what" = memory ]; then
    echo "== coordinator memory (peak RSS, one round, 10 vs 200 clients)"
    STRATA_DATA_DIR="$DATA" bash tests/bench/coordinator_memory.sh build none uniform:0.01
fi

if [ "$what" = all ] || [ "$what" = load ]; then
    echo "== coordinator load (${LOAD_CLIENTS:-1000} clients: uploads/s, latency, CPU, peak RSS;" \
        "open-loop sweep${LOAD_BASELINE_REV:+; against $LOAD_BASELINE_REV})"
    # Exit 1 only says the throughput goal was missed: report, do not abort.
    STRATA_DATA_DIR="$DATA" LOAD_RATES=${LOAD_RATES-1000 2000 4000 6000 8000} \
        bash tests/bench/load.sh build || [ $? -eq 1 ]
fi

if [ "$what" = all ] || [ "$what" = sim ]; then
    echo "== strata-sim at scale (100 clients, 10 per round, 20 rounds; peak RSS in kB)"
    STRATA_DATA_DIR="$DATA" bash tests/bench/sim_scale.sh build 20 3
fi

if [ "$what" = all ] || [ "$what" = replicas ]; then
    echo "== three coordinators on PostgreSQL behind HAProxy against one on SQLite (1000 clients)"
    STRATA_DATA_DIR="$DATA" bash tests/bench/replicas.sh build
fi
