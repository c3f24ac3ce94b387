#!/usr/bin/env bash
# Builds the configuration fuzzer (clang, libFuzzer, ASan+UBSan) in build-fuzz/ and runs it
# for a bounded time over the corpus in tests/fuzz/corpus. Fails on any crash, hang, leak or
# violated property; the input that failed is kept under build-fuzz/artifacts/ and printed.
# The corpus in the repository is only read: new inputs go to a scratch directory.
#   FUZZ_SECONDS=60 (default)  how long to fuzz
#   FUZZ_SEED=n                replay a run's mutation sequence (libFuzzer's -seed)
# Installs clang-14 and libclang-rt-14-dev (which holds libclang_rt.fuzzer) with apt when no
# clang on the machine can link -fsanitize=fuzzer.
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=${FUZZ_SECONDS:-60}

links_fuzzer() {
  echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }' |
    "$1" -fsanitize=fuzzer,address,undefined -x c - -o /dev/null >/dev/null 2>&1
}
cc=""
for c in clang clang-14; do
  if command -v "$c" >/dev/null 2>&1 && links_fuzzer "$c"; then cc=$c; break; fi
done
if [ -z "$cc" ]; then
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq clang-14 libclang-rt-14-dev >/dev/null
  cc=clang-14
  links_fuzzer "$cc" || { echo "fuzz: $cc cannot link -fsanitize=fuzzer" >&2; exit 1; }
fi

cmake -S . -B build-fuzz -DCMAKE_C_COMPILER="$cc" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DSPW_BUILD_FUZZ=ON -DSPW_WITH_CUDA=OFF -DSPW_SANITIZE=address,undefined \
  -DSPW_BUILD_TESTS=OFF -DSPW_BUILD_BENCH=OFF -DSPW_BUILD_DEMO=OFF >/dev/null
cmake --build build-fuzz -j"$(nproc)" --target fuzz_config

scratch=$(mktemp -d "${TMPDIR:-/tmp}/spw-fuzz-XXXXXX")
trap 'rm -rf "$scratch"' EXIT
rm -rf build-fuzz/artifacts && mkdir -p build-fuzz/artifacts
args=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=4096
      -dict=tests/fuzz/config.dict -artifact_prefix=build-fuzz/artifacts/ -print_final_stats=1)
[ -n "${FUZZ_SEED:-}" ] && args+=(-seed="$FUZZ_SEED")
echo "fuzz: $cc, ${seconds}s over tests/fuzz/corpus ($(ls tests/fuzz/corpus | wc -l) files)"
set +e
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  build-fuzz/tests/fuzz/fuzz_config "${args[@]}" "$scratch" tests/fuzz/corpus \
  >build-fuzz/fuzz.log 2>&1
rc=$?
set -e
grep -E '^(INFO: Seed|Done|stat::)' build-fuzz/fuzz.log || true
if [ "$rc" -ne 0 ]; then
  grep -v -E '^#[0-9]+' build-fuzz/fuzz.log | tail -60
  for f in build-fuzz/artifacts/*; do
    [ -f "$f" ] || continue
    echo "--- failing input $f (add it to tests/fuzz/corpus/ as a regression once fixed):"
    cat -v "$f"; echo
  done
  echo "fuzz: FAILED (exit $rc)"
  exit 1
fi
echo "fuzz: $(ls "$scratch" | wc -l) new inputs this run, no property violated"
