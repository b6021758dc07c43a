#!/usr/bin/env bash
# Runs every Strata test on a fresh Debian machine: installs what is missing,
# builds in Release and runs all ctest entries (unit, integration), then an
# ASan+UBSan build of the unit tests, a ThreadSanitizer build of the
# coordinator's concurrency tests, the fuzz targets for a bounded time
# (when clang's libFuzzer runtime is present) and the clang-format check.
# Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

bash scripts/setup.sh

jobs=$(nproc 2>/dev/null || echo 2)
export STRATA_DATA_DIR=${STRATA_DATA_DIR:-/usr/share/datasets/fashion-mnist}

echo "== Release build and all tests"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$jobs"
(cd build && ctest --output-on-failure --timeout 900)

echo "== ASan+UBSan build of the unit tests"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DSTRATA_SANITIZE=ON -DSTRATA_UNIT_ONLY=ON >/dev/null
cmake --build build-asan -j"$jobs"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --output-on-failure -L unit --timeout 900)

echo "== ThreadSanitizer build of the coordinator's concurrency tests"
cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DSTRATA_TSAN=ON >/dev/null
cmake --build build-tsan -j"$jobs"
(cd build-tsan && OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \
    TSAN_OPTIONS="halt_on_error=1 exitcode=66 second_deadlock_stack=1" \
    ctest --output-on-failure -L concurrency --timeout 900)

fuzz_lib=$(clang -print-file-name=libclang_rt.fuzzer-x86_64.a 2>/dev/null || true)
if command -v clang >/dev/null && [ -n "$fuzz_lib" ] && [ -f "$fuzz_lib" ] &&
    ls tests/fuzz/fuzz_*.c >/dev/null 2>&1; then
    echo "== libFuzzer targets (bounded time each)"
    CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DSTRATA_FUZZ=ON >/dev/null
    cmake --build build-fuzz -j"$jobs"
    seconds=${STRATA_FUZZ_SECONDS:-20}
    for target in tests/fuzz/fuzz_*.c; do
        name=$(basename "$target" .c)
        corpus_src="tests/fuzz/corpus/${name#fuzz_}"
        dict="tests/fuzz/${name#fuzz_}.dict" # a target's dictionary, when it has one
        dict_arg=()
        [ -f "$dict" ] && dict_arg=(-dict="$dict")
        work=$(mktemp -d)
        [ -d "$corpus_src" ] && cp -r "$corpus_src"/. "$work"/
        echo "-- $name for ${seconds}s"
        log="$work.log"
        status=0
        ./build-fuzz/"$name" -max_total_time="$seconds" -rss_limit_mb=2048 -print_final_stats=1 \
            "${dict_arg[@]}" "$work" >"$log" 2>&1 || status=$?
        grep -E "^(stat::number_of_executed_units|stat::new_units_added|==.*ERROR|SUMMARY)" "$log" || true
        if [ "$status" -ne 0 ]; then
            tail -n 40 "$log"
            rm -rf "$work" "$log"
            echo "fuzz target $name failed (exit $status)"
            exit 1
        fi
        rm -rf "$work" "$log"
    done
else
    echo "== libFuzzer runtime not found: fuzz targets skipped"
fi

echo "== clang-format check"
files=$(git -C "$root" ls-files '*.c' '*.h' 2>/dev/null || find shared client server tests -name '*.[ch]')
clang-format --dry-run -Werror $files

echo "All Strata tests passed."
