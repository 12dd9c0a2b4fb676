#!/usr/bin/env bash
# Runs the libFuzzer targets (fuzz/, docs/fuzzing.md) of a KVSIM_FUZZ=ON build
# (scripts/test.sh --sanitize makes one in build-sanitize/).
#   scripts/fuzz.sh --smoke                 every target 7 s from its seeds: CI (42 s of fuzzing in all)
#   scripts/fuzz.sh --seconds 600 [TARGET]  long runs; the corpus grows in BUILD/fuzz/corpus/TARGET
# Options: --build DIR (default build-sanitize), --jobs N (parallel fuzzing processes per target).
# Crash inputs go to BUILD/fuzz/crashes/TARGET, logs to BUILD/fuzz/logs; exits 1 when a target
# crashed, and prints each target's executions.
set -euo pipefail
cd "$(dirname "$0")/.."
build="${KVSIM_BUILD:-build}-sanitize"
seconds=7
jobs=1
smoke=0
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --smoke) smoke=1 ;;
    --seconds) seconds=$2; shift ;;
    --build) build=$2; shift ;;
    --jobs) jobs=$2; shift ;;
    fuzz_*) targets+=("$1") ;;
    *) echo "usage: scripts/fuzz.sh [--smoke | --seconds S] [--build DIR] [--jobs N] [fuzz_TARGET...]" >&2; exit 2 ;;
  esac
  shift
done
[ ${#targets[@]} -gt 0 ] || targets=(fuzz_gguf fuzz_trace fuzz_trace_hdf5 fuzz_requests fuzz_mooncake fuzz_sweep_resume
                                     fuzz_policy_spec fuzz_learned_model fuzz_serve_profile fuzz_estimator fuzz_basis
                                     fuzz_rlkv_tsv fuzz_verify_csv fuzz_result_files)
for t in "${targets[@]}"; do
  [ -x "$build/fuzz/$t" ] || { echo "fuzz: $build/fuzz/$t is missing: build with scripts/test.sh --sanitize" >&2; exit 2; }
done
seeds="$build/fuzz/seeds"
if [ "$smoke" = 1 ]; then
  # A smoke run starts clean: fresh seeds for the targets as built, no scratch files of old runs.
  rm -rf "$seeds" /dev/shm/kvsim-fuzz-* 2>/dev/null || true
fi
[ -d "$seeds" ] || fuzz/make_corpus.sh "$build" "$seeds"

# Longest input each target mutates: the shrunk models are ~95 KB, the small traces ~60 KB.
max_len() {
  case "$1" in
    fuzz_gguf) echo 200000 ;;
    fuzz_trace | fuzz_trace_hdf5) echo 150000 ;;
    fuzz_learned_model) echo 100000 ;;
    fuzz_sweep_resume | fuzz_basis) echo 16384 ;;
    *) echo 8192 ;;
  esac
}

failed=0
mkdir -p "$build/fuzz/logs"
for t in "${targets[@]}"; do
  crashes="$build/fuzz/crashes/$t"
  log="$build/fuzz/logs/$t.log"
  mkdir -p "$crashes"
  before=$(find "$crashes" -type f | sort)
  if [ "$smoke" = 1 ]; then
    corpus="$build/fuzz/smoke/$t"  # new inputs of a smoke run are thrown away
    rm -rf "$corpus"
  else
    corpus="$build/fuzz/corpus/$t"
  fi
  mkdir -p "$corpus"
  args=(-max_total_time="$seconds" -max_len="$(max_len "$t")" -timeout=30 -rss_limit_mb=4096
        -print_final_stats=1 -artifact_prefix="$crashes/")
  [ "$smoke" = 0 ] || args+=(-seed=1)
  # fuzz_trace_hdf5 reads traces unprotected, to find HDF5 1.10's own memory errors on corrupt
  # metadata: -fork keeps it going past one and keeps every crash input (the hostile traces the
  # probed open must survive); it fails only for a crash that triage.py places outside HDF5. Every
  # other target, fuzz_trace included (its reads are probed), fails on any crash.
  forked=0
  if [ "$t" = fuzz_trace_hdf5 ] || [ "$jobs" -gt 1 ]; then
    args+=(-fork="$jobs")
    forked=1
    [ "$t" != fuzz_trace_hdf5 ] || args+=(-ignore_crashes=1)
  fi
  echo "fuzz: $t for ${seconds}s"
  ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}" \
    LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$PWD/fuzz/lsan.supp}" \
    UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}" \
    "$build/fuzz/$t" "${args[@]}" "$corpus" "$seeds/$t" > "$log" 2>&1 && rc=0 || rc=$?
  new=$(comm -13 <(echo "$before") <(find "$crashes" -type f | sort) | grep -v '/slow-unit-' || true)
  status=ok
  if [ "$forked" = 1 ]; then
    # A fork run exits with its last job's code, crash or not: it fails when it did not finish, or
    # when a new crash input is located outside HDF5 (triage.py reruns each one).
    grep -q '^INFO: exiting' "$log" || status=CRASHED
    # shellcheck disable=SC2086
    [ -z "$new" ] || fuzz/triage.py "$build" --fail-outside libhdf5 $new || status=CRASHED
  elif [ "$rc" != 0 ]; then
    status=CRASHED
  fi
  if [ "$status" = CRASHED ]; then
    failed=1
    tail -n 60 "$log" >&2
  fi
  # Executions: libFuzzer's final stats; a fork run prints only progress lines (#N: cov ...).
  execs=$(awk '/stat::number_of_executed_units:/ {s += $2} END {print s + 0}' "$log")
  [ "$execs" != 0 ] || execs=$(awk '/^#[0-9]+: cov/ {n = substr($1, 2)} END {print n + 0}' "$log")
  echo "fuzz: $t $status, $execs executions, $(find "$corpus" -type f | wc -l) new corpus inputs," \
       "$(echo -n "$new" | grep -c . || true) new crash inputs in $crashes"
  scripts/clean_shm.sh
done
exit $failed
