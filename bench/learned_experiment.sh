#!/usr/bin/env bash
# The learned-policy experiment (issue 41, docs/experiments/learned.md). SmolLM2 generates MAX_NEW
# (256) tokens per request while the cache is held to its budget at every step (peak semantics,
# re-applied every REAPPLY tokens), so the learned policies act at every eviction event. They are
# trained on some task families (TRAIN_FAMILIES) and judged on held-out requests of those families
# and of families never seen in training (UNSEEN), against the heuristics re-applied in the same
# setting, the quantized tiers and the oracle, offline and live, with SEEDS training seeds each.
#   PILOT=1 bench/learned_experiment.sh   time one request, one seed, live reward at 256 tokens, and
#                                         estimate the grid below from it (run this first)
#   bench/learned_experiment.sh           the grid (after scripts/setup.sh); tables by
#                                         analysis/learned_table.py $OUT
# A cut run resumes: REUSE=1 keeps the captured traces; trained models, the estimator and each
# budget's live runs (DIR/verify_b<budget>.csv) are kept when present (RETRAIN=1, RELIVE=1 redo).
# rlkv and KVzip cannot run under peak semantics: a second table compares them with the
# live-reward distillcache at the compression point (POINT_BASELINES, live at POINT_BUDGETS).
# Every knob below is an environment variable; docs/experiments/learned.md records the ones used.
set -euo pipefail
cd "$(dirname "$0")/.."
KVSIM=${KVSIM:-build/kvsim}
MODEL=${MODEL:-$HOME/.cache/kvsim/models/SmolLM2-135M-Instruct.Q4_1.gguf}
OUT=${OUT:-out/learned}
MODES=${MODES:-query-aware query-agnostic}
LIVE_MODES=${LIVE_MODES:-$MODES}     # modes verified live (the others offline only)
MAX_NEW=${MAX_NEW:-256}
TOKENS=${TOKENS:-768}                # prompt context, estimated at 4 characters a token
ITEMS=${ITEMS:-24}                   # records of recall and running-total tasks
REAPPLY=${REAPPLY:-32}
BUDGETS=${BUDGETS:-0.1,0.25,0.5}
SEEDS=${SEEDS:-1 2 3}
TRAIN_FAMILIES=${TRAIN_FAMILIES:-recall running-total single multikey}
UNSEEN=${UNSEEN:-continue vartrack}
TRAIN_PER_FAMILY=${TRAIN_PER_FAMILY:-2}
HELD_PER_FAMILY=${HELD_PER_FAMILY:-1}
CAL_REQUESTS=${CAL_REQUESTS:-3}      # training requests the estimator of the trace reward is fitted on
STEPS=${STEPS:-300}                  # foresight
EPISODES=${EPISODES:-30}             # distillcache, trace reward
LIVE_EPISODES=${LIVE_EPISODES:-8}   # distillcache, live reward
LIVE_MAX_NEW=${LIVE_MAX_NEW:-64}     # its horizon
RLKV_STEPS=${RLKV_STEPS:-30}
LEARNED=${LEARNED:-foresight distillcache distillcache_live rlkv}
BASELINES=${BASELINES:-"h2o;tova;snapkv;keydiff;streamingllm;kivi;qevict:retier=$REAPPLY"}
ORACLES=${ORACLES:-oracle_golden}
# The point-semantics comparison: rlkv (one model-wide allocation, refused under peak semantics)
# and the live-reward distillcache beside KVzip (whose reconstruction pass covers only the context,
# so it cannot re-apply while decoding), at the compression point only.
POINT_BASELINES=${POINT_BASELINES:-"kvzip;snapkv;streamingllm"}
POINT_BUDGETS=${POINT_BUDGETS:-0.25}   # live (offline: every budget)
TEXT=${TEXT:-/usr/share/common-licenses/GPL-3}
PEAK=(--budget-semantics peak --reapply-every "$REAPPLY")
# Every continuation runs the full MAX_NEW tokens: no end of generation before (min_new_tokens).
GEN=(--max-new "$MAX_NEW" --min-new "$MAX_NEW")
mkdir -p "$OUT"
now() { date +%s.%N; }
took() { python3 -c "print(f'{$(now) - $1:.1f}')"; }

family() {  # SPLIT FAMILY COUNT SEED: requests of one family, ids prefixed with the split, appended to SPLIT.jsonl
  local split=$1 fam=$2 count=$3 seed=$4 f="$OUT/$1-$2.jsonl"
  case "$fam" in
    recall | running-total) "$KVSIM" tasks long --kind "$fam" --tokens "$TOKENS" --items "$ITEMS" --count "$count" \
      --seed "$seed" -o "$f" --force -q ;;
    continue) "$KVSIM" tasks long --kind continue --file "$TEXT" --tokens "$TOKENS" --count "$count" -o "$f" --force -q ;;
    *) "$KVSIM" tasks needle --kind "$fam" --tokens "$TOKENS" --count "$count" --seed "$seed" -o "$f" --force -q ;;
  esac
  sed "s/\"id\":\"/\"id\":\"$split-/" "$f" >> "$OUT/$split.jsonl"
}

if [ "${PILOT:-0}" = 1 ]; then
  # One request, one seed, live reward at MAX_NEW tokens: the unit costs the grid is sized from.
  : > "$OUT/pilot.jsonl"
  family pilot recall 1 7
  t=$(now)
  "$KVSIM" capture -m "$MODEL" -r "$OUT/pilot.jsonl" -o "$OUT/pilot.h5" --force -q --queries all "${GEN[@]}"
  capture_s=$(took "$t")
  t=$(now)
  "$KVSIM" train distillcache "$OUT/pilot.h5" -o "$OUT/pilot_trace.h5" --force --episodes 1 --budgets 0.25 \
    "${PEAK[@]}" 2> "$OUT/pilot_trace.txt"
  trace_s=$(took "$t")
  t=$(now)
  "$KVSIM" train distillcache "$OUT/pilot.h5" -o "$OUT/pilot_live.h5" --force --episodes 1 --budgets 0.25 \
    "${PEAK[@]}" --reward live -m "$MODEL" -t "$OUT/pilot.jsonl" "${GEN[@]}" 2> "$OUT/pilot_live.txt"
  live_s=$(took "$t")
  t=$(now)
  "$KVSIM" verify -m "$MODEL" -t "$OUT/pilot.jsonl" -p snapkv -b 0.25 "${GEN[@]}" "${PEAK[@]}" \
    -o "$OUT/pilot_verify.csv" --force -q > /dev/null
  verify_s=$(took "$t")
  python3 - "$capture_s" "$trace_s" "$live_s" "$verify_s" <<EOF
import sys
cap, trace, live, verify = map(float, sys.argv[1:])
modes, live_modes = len("$MODES".split()), len("$LIVE_MODES".split())
seeds, budgets = len("$SEEDS".split()), len("$BUDGETS".split(","))
fams, unseen = len("$TRAIN_FAMILIES".split()), len("$UNSEEN".split())
train_n, held_n = fams * $TRAIN_PER_FAMILY, (fams + unseen) * $HELD_PER_FAMILY
learned, baselines = len([m for m in "$LEARNED".split() if m != "rlkv"]), len("$BASELINES".split(";"))
live_episode = live * $LIVE_MAX_NEW / $MAX_NEW  # an episode's cost scales with its horizon
configs = (learned * seeds + baselines) * budgets
print(f"pilot: capture {cap:.0f} s, one trace-reward episode {trace:.0f} s, one live-reward episode at {$MAX_NEW} "
      f"tokens {live:.0f} s, one live config {verify:.0f} s (each with start-up)")
est = {"capture": (train_n + held_n) * cap,
       "training": modes * seeds * ($EPISODES * trace + $LIVE_EPISODES * live_episode),
       "calibration": modes * $CAL_REQUESTS * 4 * 2 * verify,
       "live verify": live_modes * configs * held_n * verify}
for k, v in est.items(): print(f"  {k:12s} ~{v / 60:.0f} min")
print(f"  total        ~{sum(est.values()) / 60:.0f} min ({configs} configs x {held_n} held-out requests per mode)")
EOF
  exit 0
fi

if [ "${REUSE:-0}" = 1 ] && [ -f "$OUT/train.h5" ] && [ -f "$OUT/heldout.h5" ]; then
  echo "(reusing $OUT/train.h5 and $OUT/heldout.h5)"
else
  : > "$OUT/train.jsonl"
  : > "$OUT/heldout.jsonl"
  seed=101
  for fam in $TRAIN_FAMILIES; do family train "$fam" "$TRAIN_PER_FAMILY" $((seed++)); done
  for fam in $TRAIN_FAMILIES $UNSEEN; do family heldout "$fam" "$HELD_PER_FAMILY" $((seed++)); done
  printf 'train: %s\nunseen: %s\n' "$TRAIN_FAMILIES" "$UNSEEN" > "$OUT/families.txt"
  # Features read the last 32 queries before each decision point and the rewards every decode
  # step: recorded in training; the held-out trace records every query, which H2O's score needs.
  "$KVSIM" capture -m "$MODEL" -r "$OUT/train.jsonl" -o "$OUT/train.h5" --force -q --queries eval --query-window 64 \
    "${GEN[@]}"
  "$KVSIM" capture -m "$MODEL" -r "$OUT/heldout.jsonl" -o "$OUT/heldout.h5" --force -q --queries all --repeat-pass \
    "${GEN[@]}"
fi
echo "train: $(wc -l < "$OUT/train.jsonl") requests; held out: $(wc -l < "$OUT/heldout.jsonl")"

# DIR SUFFIX POLICIES BUDGETS SWEEP [options]: the live runs, one file per budget
# (DIR/verify<SUFFIX>_b<budget>.csv); a budget whose file exists is kept, so a cut run resumes.
live_by_budget() {
  local dir=$1 suffix=$2 policies=$3 budgets=$4 sweep=$5 b f t
  shift 5
  for b in ${budgets//,/ }; do
    f="$dir/verify${suffix}_b$b.csv"
    [ -f "$f" ] && [ "${RELIVE:-0}" != 1 ] && continue
    t=$(now)
    "$KVSIM" verify -m "$MODEL" -t "$OUT/heldout.jsonl" -p "$policies" -b "$b" --mode "$mode" "${GEN[@]}" "$@" \
      --offline "$sweep" -o "$f.part" --force -q > "${f%.csv}.txt"
    mv "$f.part" "$f"
    echo "live verify, $mode$suffix at $b: $(took "$t") s" | tee -a "$dir/train_seconds.txt"
  done
}

for mode in $MODES; do
  d="$OUT/$mode"
  mkdir -p "$d"
  # The trace reward's estimator: est_kl's layer weights fitted to live runs of CAL_REQUESTS
  # training requests (kvsim calibrate), in this mode and setting.
  if [ ! -f "$d/estimator.json" ]; then
    # One request of each training family first, so the fit sees every family.
    python3 -c "
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
fams = {}
for r in rows: fams.setdefault(r['id'].rsplit('-', 1)[0], []).append(r)
picked = [r for k in range(len(rows)) for f in fams.values() if k < len(f) for r in [f[k]]][:int(sys.argv[2])]
print(''.join(json.dumps(r) + chr(10) for r in picked), end='')" "$OUT/train.jsonl" "$CAL_REQUESTS" > "$d/calibration.jsonl"
    "$KVSIM" sweep "$OUT/train.h5" -p "snapkv;tova;streamingllm;keydiff" -b 0.1,0.25 --mode "$mode" \
      "${PEAK[@]}" -o "$d/calibration_sweep.csv" --detail "$d/calibration_sweep.jsonl" --force -q > /dev/null
    "$KVSIM" verify -m "$MODEL" -t "$d/calibration.jsonl" --offline "$d/calibration_sweep.csv" \
      -p "snapkv;tova;streamingllm;keydiff" -b 0.1,0.25 --mode "$mode" "${GEN[@]}" "${PEAK[@]}" \
      -o "$d/calibration_verify.csv" --force -q > /dev/null
    "$KVSIM" calibrate --offline "$d/calibration_sweep.csv" --detail "$d/calibration_sweep.jsonl" \
      --live "$d/calibration_verify.csv" -o "$d/estimator.json" --force | tee "$d/calibrate.txt"
  fi
  policies=""
  for seed in $SEEDS; do
    s="$d/seed$seed"
    mkdir -p "$s"
    train() {  # METHOD OUT [options]: train one method with this seed, its log beside the model
      local method=$1 model=$2; shift 2
      [ -f "$model" ] && [ "${RETRAIN:-0}" != 1 ] && return 0
      t=$(now)
      "$KVSIM" train "$method" "$OUT/train.h5" --mode "$mode" --seed "$seed" -o "$model" --force "$@" 2>&1 |
        tee "${model%.h5}.txt" | grep -v "^train: reading" | tail -n 3
      echo "$method seed $seed: $(took "$t") s" | tee -a "$d/train_seconds.txt"
    }
    for m in $LEARNED; do
      case "$m" in
        foresight) train foresight "$s/foresight.h5" --steps "$STEPS" --decode-block "$REAPPLY" ;;
        distillcache) train distillcache "$s/distillcache.h5" --episodes "$EPISODES" --init "$s/foresight.h5" \
          "${PEAK[@]}" --estimator "$d/estimator.json" ;;
        distillcache_live) train distillcache "$s/distillcache_live.h5" --episodes "$LIVE_EPISODES" \
          --init "$s/foresight.h5" "${PEAK[@]}" --reward live -m "$MODEL" -t "$OUT/train.jsonl" --max-new "$LIVE_MAX_NEW" --min-new "$LIVE_MAX_NEW" ;;
        rlkv) train rlkv "$s/rlkv.h5" --steps "$RLKV_STEPS" --estimator "$d/estimator.json" ;;
      esac
      method=${m%_live}
      [ "$m" = rlkv ] || policies="$policies;$method:model=$s/$m.h5"
      if [ "$m" = rlkv ] || [ "$m" = distillcache_live ]; then
        point_policies="${point_policies:-};$method:model=$s/$m.h5"
      fi
    done
  done
  policies="${policies#;};$BASELINES"
  if [ -n "${point_policies:-}" ]; then
    point="${point_policies#;};$POINT_BASELINES"
    "$KVSIM" sweep "$OUT/heldout.h5" -p "$point" -b "$BUDGETS" --mode "$mode" -o "$d/sweep_point.csv" --force -q \
      > "$d/sweep_point.txt"
    if [ "${POINT_LIVE:-1}" = 1 ] && [[ " $LIVE_MODES " == *" $mode "* ]]; then
      live_by_budget "$d" _point "$point" "$POINT_BUDGETS" "$d/sweep_point.csv"
    fi
    point_policies=""
  fi
  "$KVSIM" sweep "$OUT/heldout.h5" -p "$policies;$ORACLES" -b "$BUDGETS" --mode "$mode" "${PEAK[@]}" \
    --estimator "$d/estimator.json" -o "$d/sweep.csv" --detail "$d/sweep.jsonl" --force -q > "$d/sweep.txt"
  if [[ " $LIVE_MODES " == *" $mode "* ]]; then
    live_by_budget "$d" "" "$policies" "$BUDGETS" "$d/sweep.csv" "${PEAK[@]}"
  fi
done
PYTHON=${PYTHON:-${KVSIM_CACHE:-$HOME/.cache/kvsim}/venv/bin/python}  # scripts/setup.sh's venv (pandas)
[ -x "$PYTHON" ] || PYTHON=python3
"$PYTHON" analysis/learned_table.py "$OUT" | tee "$OUT/tables.md"
