#!/usr/bin/env bash
# test_runs.sh — a run's directory keeps what it holds: a new run does not
# overwrite an earlier one (--overwrite replaces it whole), a run's own
# config.yaml loads back as the run's config, a run killed after a
# checkpoint resumes to the uninterrupted run's bytes in every mode, SIGINT
# and SIGTERM stop a run with a checkpoint that resumes bit for bit and
# leave no stray file, start-up clears the temp files of killed writes and
# pruning keeps exactly the newest checkpoints, and what can be checked
# before the first step is: the checkpoint folder, the memory the model
# needs, the checkpoint's metadata; a full disk under metrics.jsonl stops
# the run with a checkpoint; weights a diverged run saved are refused by
# eval and generate. Closing line "N passed, N failed".
. "$(dirname "$0")/../harness.sh"

# expect_error NAME ERE ARGS...: exit 1 and one stderr line matching ERE.
expect_error() {
  local name=$1 ere=$2
  shift 2
  run "$@"
  local lines
  lines=$(wc -l <"$T/stderr")
  if [ "$rc" -eq 1 ] && [ "$lines" -eq 1 ] && [[ $err =~ $ere ]]; then pass; else
    fail "$name" "strata $*" "rc $rc (want 1), $lines stderr line(s), want: $ere" "$err"
  fi
}

# stray NAME DIR: no temp file in DIR.
no_stray() {
  local left
  left=$(find "$2" -name '*.tmp*' 2>/dev/null)
  if [ -z "$left" ]; then pass; else fail "$1: temp files left" "$left"; fi
}

checkpoints() { ls "$1/checkpoints" 2>/dev/null | grep -c '\.safetensors$'; }

fc=configs/fc_mnist.yaml
cnn=configs/cnn_fmnist.yaml
small=(--set data.train_limit=512 --set data.test_limit=128 --set train.batch=32
       --set metrics.progress=off)

# --- 1. an earlier run is not overwritten -------------------------------------
run train "$fc" "${small[@]}" --set train.steps=40 --set train.checkpoint_every=10 \
  --set train.keep_checkpoints=0 --out "$T/first"
[ "$rc" -eq 0 ] && pass || fail "first run" "$err"
cp "$T/first/config.yaml" "$T/first.config"
expect_error "--out onto an earlier run" \
  "^strata: error: $(re_quote "$T/first"): holds an earlier run \(4 checkpoints up to step 40, metrics.jsonl, summary.json\): --resume $(re_quote "$T/first") continues it, --overwrite replaces it, or give another --out$" \
  train "$fc" "${small[@]}" --set train.steps=20 --set train.seed=7 --out "$T/first"
if cmp -s "$T/first/config.yaml" "$T/first.config" && [ "$(checkpoints "$T/first")" -eq 4 ]; then
  pass
else
  fail "a refused run leaves the earlier one as it was"
fi
# --overwrite whose new run fails before it starts (a mistyped data path,
# a model that cannot be made): the earlier run is put back as it was. It
# used to be removed first, leaving a folder with only the new config.yaml.
(cd "$T/first" && find . -type f | sort | xargs md5sum) >"$T/first.sums"
expect_error "--overwrite with data that is not there" \
  "^strata: error: --set: data.dir: $(re_quote "$T/nowhere")/train-labels-idx1-ubyte\.gz: cannot open" \
  train "$fc" "${small[@]}" --set data.dir="$T/nowhere" --overwrite --out "$T/first"
expect_error "--overwrite with a model that cannot be made" \
  "model\.channels: stage 4 would pool a 1x1 map below 1x1" \
  train "$cnn" "${small[@]}" --set model.channels=[8,8,8,8,8,8] --overwrite --out "$T/first"
if (cd "$T/first" && find . -type f | sort | xargs md5sum) | cmp -s - "$T/first.sums"; then
  pass
else
  fail "a failed --overwrite puts the earlier run back, byte for byte" \
    "$(cd "$T/first" && find . | sort)"
fi
# --overwrite: nothing of the first run is left to mix with the second
run train "$fc" "${small[@]}" --set train.steps=20 --set train.seed=7 --overwrite --out "$T/first"
if [ "$rc" -eq 0 ] && grep -q "^strata: --overwrite: removed the earlier run in $(re_quote "$T/first") (4 checkpoints" <<<"$out" &&
   [ "$(ls "$T/first/checkpoints")" = "step-00000020.safetensors" ] &&
   grep -q '^  seed: 7$' "$T/first/config.yaml" &&
   ! grep -q '"step":40' "$T/first/metrics.jsonl"; then
  pass
else
  fail "--overwrite removes the earlier run's files first" "rc $rc" "$out" "$err" "$(ls "$T/first/checkpoints")"
fi
run train - --resume "$T/first" --overwrite
if [ "$rc" -eq 2 ] && grep -q "give one of the two" <<<"$err"; then pass; else
  fail "--resume with --overwrite is a usage error" "rc $rc" "$err"
fi
run train - --resume "$T/first" --out "$T/elsewhere"
if [ "$rc" -eq 2 ] && grep -q "continues the run in DIR; --out names another" <<<"$err" &&
   [ ! -e "$T/elsewhere" ]; then pass; else
  fail "--resume with --out is a usage error" "rc $rc" "$err"
fi
run train - --set train.steps=2
if [ "$rc" -eq 1 ] && grep -q "^strata: error: -: CONFIG '-' is DIR/config.yaml in 'strata train - --resume DIR'" <<<"$err"; then
  pass; else fail "CONFIG '-' without --resume is explained" "rc $rc" "$err"
fi
# resuming a finished run trains nothing and rewrites nothing: its summary
# keeps the run's figures
sums() { (cd "$1" && find . -type f | sort | xargs md5sum); }
before_sums=$(sums "$T/first")
run train - --resume "$T/first"
if [ "$rc" -eq 0 ] && grep -q "finished at step 20 of 20: nothing to train, nothing rewritten" <<<"$out" &&
   [ "$before_sums" = "$(sums "$T/first")" ]; then pass; else
  fail "resuming a finished run leaves it as it was" "rc $rc" "$out" "$err"
fi
# one killed after its last checkpoint, before its summary, is not finished:
# the resume makes the final evaluation and the summary
rm -rf "$T/nosum" && cp -r "$T/first" "$T/nosum" && rm "$T/nosum/summary.json"
run train - --resume "$T/nosum"
if [ "$rc" -eq 0 ] && ! grep -q "nothing to train" <<<"$out" &&
   grep -q '"interrupted": false' "$T/nosum/summary.json" &&
   grep -q '"evaluated_at_step": 20' "$T/nosum/summary.json"; then pass; else
  fail "a run at its last step without a summary gets one on resume" "rc $rc" "$out" "$err"
fi
# its final evaluation was logged before the kill: the log is not given it
# twice, and the summary holds its figures
if [ "$rc" -eq 0 ] && cmp -s "$T/first/metrics.jsonl" "$T/nosum/metrics.jsonl" &&
   [ "$(grep '"test_' "$T/first/summary.json")" = "$(grep '"test_' "$T/nosum/summary.json")" ]; then pass; else
  fail "a resume at the last step logs no second evaluation" "$(diff "$T/first/metrics.jsonl" "$T/nosum/metrics.jsonl")"
fi
# it took no step, so it measured no rate (not "0 samples/s")
if grep -q "training rate: not measured (no step in this run), plan predicted" <<<"$out" &&
   ! grep -q "measured 0 samples/s" <<<"$out"; then pass; else
  fail "a resume that takes no step says its rate was not measured" "$out"
fi
# the same with its last checkpoint sharded and the resume writing single
# files: the final checkpoint goes to step-N.safetensors beside the
# shards' folder step-N (it was written at the folder's path, which the
# rename could not replace: "Is a directory")
run train "$fc" "${small[@]}" --set train.steps=20 --set train.checkpoint_every=10 \
  --set train.checkpoint_format=shards --out "$T/nosum_shards"
rm -f "$T/nosum_shards/summary.json"
run train - --resume "$T/nosum_shards" --set train.checkpoint_format=single
if [ "$rc" -eq 0 ] && grep -q '"interrupted": false' "$T/nosum_shards/summary.json" &&
   [ -f "$T/nosum_shards/checkpoints/step-00000020.safetensors" ]; then pass; else
  fail "a sharded run at its last step resumed with single checkpoints" "rc $rc" "$out" "$err"
fi
# a run whose checkpoints were removed does not start again from step 0
# under --resume: its summary says it took steps
cp -r "$T/first" "$T/gone" && rm -f "$T/gone"/checkpoints/*
expect_error "--resume of a run whose checkpoints are gone" \
  "^strata: error: $(re_quote "$T/gone"): no checkpoint in checkpoints/, yet $(re_quote "$T/gone")/summary.json says the run took steps: it cannot continue \(--overwrite starts it again\)$" \
  train - --resume "$T/gone"
# a killed run (no summary) resumed with a config that looks for its state
# elsewhere started again at step 0 beside the steps it took: refused, the
# store a checkpoint run would look for, the checkpoints a store run would,
# and a store at another path
cp -r "$T/first" "$T/elsewhere" && rm "$T/elsewhere/summary.json"
expect_error "--resume of a checkpoint run with a file store" \
  "^strata: error: $(re_quote "$T/elsewhere")/store.strata: no store, but $(re_quote "$T/elsewhere")/checkpoints/step-[0-9]{8}\\.safetensors holds step [0-9]+: the run kept checkpoints; resume it without execution.store: file \(or --overwrite to start again\)$" \
  train - --resume "$T/elsewhere" --set execution.mode=weight_streaming --set execution.store=file
run train "$fc" "${small[@]}" --set train.steps=20 --set execution.mode=weight_streaming \
  --set execution.store=file --out "$T/stored"
rm -f "$T/stored/summary.json"
expect_error "--resume of a store run without its store" \
  "^strata: error: $(re_quote "$T/stored"): no checkpoint in checkpoints/, but $(re_quote "$T/stored")/store.strata holds the run's state \(its execution.store_path in $(re_quote "$T/stored")/config.yaml\): resume it with the store it kept \(or --overwrite to start again\)$" \
  train - --resume "$T/stored" --set execution.store=memory
expect_error "--resume of a store run at another store path" \
  "^strata: error: $(re_quote "$T/stored")/other.strata: no store, but $(re_quote "$T/stored")/store.strata holds the run's state" \
  train - --resume "$T/stored" --set execution.store_path="$T/stored/other.strata"
run train - --resume "$T/stored" --set train.steps=30
if [ "$rc" -eq 0 ] && grep -q '"steps": 30' "$T/stored/summary.json"; then pass; else
  fail "the store run resumed as it was trained" "rc $rc" "$err"
fi
# one process a folder: a second run, or a resume, while a run holds it is
# refused (their files would mix), and leaves the live run's files alone
"$strata" train "$fc" "${small[@]}" --set train.steps=100000 --set data.train_limit=256 \
  --out "$T/busy" >"$T/busy.out" 2>"$T/busy.err" &
busy=$!
for _ in $(seq 500); do [ -f "$T/busy/config.yaml" ] && break; sleep 0.01; done
cp "$T/busy/config.yaml" "$T/busy.config"
expect_error "a second run into a folder in use" \
  "^strata: error: $(re_quote "$T/busy"): in use by another strata process \(a run in it holds the folder's lock\): wait for it to end, or give another --out$" \
  train "$fc" "${small[@]}" --set train.steps=5 --set train.seed=9 --out "$T/busy"
expect_error "a resume of a folder in use" "^strata: error: $(re_quote "$T/busy"): in use by another strata process" \
  train - --resume "$T/busy"
cmp -s "$T/busy/config.yaml" "$T/busy.config" && pass ||
  fail "the refused run left the live run's config.yaml as it was"
kill -INT "$busy" 2>/dev/null
wait "$busy"
# once it has stopped the folder is free: the resume gets as far as the
# checkpoint (past a last step of 1: refused for that, not the lock; on a
# loaded machine the interrupt may come before the first step, and then
# the resume takes that step)
run train - --resume "$T/busy" --set train.steps=1
if { [ "$rc" -eq 1 ] && grep -q "past this run's last step 1" <<<"$err"; } ||
   { [ "$rc" -eq 0 ] && grep -q "^strata: resumed from .*step-00000000\.safetensors at step 0" <<<"$out"; }; then
  pass
else
  fail "once the run has stopped its folder is free" "rc $rc" "$out" "$err"
fi
run train "$fc" "${small[@]}" --set train.steps=2 --out ""
if [ "$rc" -eq 2 ] && grep -q "^strata: error: --out: an empty path is no directory" <<<"$err"; then pass; else
  fail "--out \"\" is refused" "rc $rc" "$err"
fi
before=$(ls / | tr '\n' ' ')
expect_error "--out /" "^strata: error: /: the filesystem root cannot hold a run; give --out DIR$" \
  train "$fc" "${small[@]}" --set train.steps=2 --out /
[ "$(ls / | tr '\n' ' ')" = "$before" ] && pass || fail "--out / wrote at the root"
# a directory a run made but never trained in (a failed start) takes a run
mkdir -p "$T/started/checkpoints"
cp "$T/first.config" "$T/started/config.yaml"
run train "$fc" "${small[@]}" --set train.steps=2 --out "$T/started"
[ "$rc" -eq 0 ] && pass || fail "a directory holding only a config.yaml takes a new run" "$err"

# --- 2. config.yaml loads back as the run's config ----------------------------
# optimizer.reference_batch rescales lr and momentum inside the trainer; the
# written config is the config as given, so a resume does not rescale twice,
# and compile plans on it as on the original (a cpu fabric, not WSE-2 PEs).
ref=(--set optimizer.reference_batch=64 --set optimizer.schedule=constant
     --set execution.mode=pipeline --set execution.stages=2
     --set execution.micro_batch=8 --set train.checkpoint_every=10)
run train "$fc" "${small[@]}" "${ref[@]}" --set train.steps=20 --out "$T/whole"
run train "$fc" "${small[@]}" "${ref[@]}" --set train.steps=10 --out "$T/half"
run train - --resume "$T/half" --set train.steps=20
if [ "$rc" -eq 0 ] && cmp -s "$T/whole/checkpoints/step-00000020.safetensors" \
   "$T/half/checkpoints/step-00000020.safetensors"; then
  pass
else
  fail "a run resumed from its own config.yaml ends bit for bit as the whole run" "rc $rc" "$err"
fi
if ! grep -q "no plan" <<<"$err" && cmp -s <(grep -v '"config":' "$T/whole/plan.json") \
   <(grep -v '"config":' "$T/half/plan.json"); then
  pass
else
  fail "the resumed run plans as the original did" "$err"
fi
run compile "$fc" "${small[@]}" "${ref[@]}" --set train.steps=20 --out "$T/plan_a"
plan_a=$out
run compile "$T/whole/config.yaml" --out "$T/plan_b"
if [ "$rc" -eq 0 ] && cmp -s <(grep -v '"config":' "$T/plan_a/plan.json") \
   <(grep -v '"config":' "$T/plan_b/plan.json"); then
  pass
else
  fail "compile DIR/config.yaml plans as the run's config" "rc $rc" "$err" "$(diff <(echo "$plan_a") <(echo "$out") | head)"
fi

# --- 2b. every mode resumes to the uninterrupted run's bytes ------------------
# A run killed just after its checkpoint at step 8 (its folder as the whole
# run left it, less the later checkpoints and the summary: what the kill
# leaves, the log's later lines too) resumes to the whole run's checkpoints
# at steps 16 and 24, byte for byte, in every mode. Step 8 is inside the
# first epoch (16 steps), between two log lines (every 5) and before an
# evaluation (every 12); dropout, a warm-up and a cosine schedule make every
# piece of state count. Its metrics.jsonl is the whole run's too, but for
# the timings (samples_per_s, wall_s). Pipelined backprop over more than one stage is left
# out: its checkpoint drops the micro-batches in flight (docs/modes.md,
# "Checkpoints"); in one stage nothing is in flight.
every=(--set data.dataset=synthetic --set data.train_limit=256 --set data.test_limit=64
       --set train.batch=16 --set train.steps=24 --set train.checkpoint_every=8
       --set train.keep_checkpoints=0 --set train.eval_every=12 --set metrics.log_every=5
       --set model.hidden=[32,32,32] --set model.dropout=0.1
       --set optimizer.warmup_steps=3 --set metrics.progress=off)
pipe2=(--set execution.mode=pipeline --set execution.stages=2 --set execution.micro_batch=4)
modes=(sequential "" replicas "--set execution.replicas=2"
       gpipe "${pipe2[*]} --set execution.schedule=gpipe"
       1f1b "${pipe2[*]} --set execution.schedule=1f1b"
       zb1p "${pipe2[*]} --set execution.schedule=zb1p"
       interleaved "${pipe2[*]} --set execution.schedule=interleaved"
       1f1b_replicas "${pipe2[*]} --set execution.schedule=1f1b --set execution.replicas=2"
       block_sequential "--set execution.mode=block_sequential --set execution.blocks_per_segment=2 --set execution.micro_batch=4"
       weight_streaming "--set execution.mode=weight_streaming --set execution.store=memory --set execution.micro_batch=8"
       pb "--set execution.mode=pipelined_backprop --set execution.stages=1 --set optimizer.nesterov=false --set optimizer.lr=0.002")
for ((k = 0; k < ${#modes[@]}; k += 2)); do
  name=${modes[k]}
  read -ra mode <<<"${modes[k + 1]}"
  run train "$fc" "${every[@]}" "${mode[@]}" --out "$T/every_$name"
  [ "$rc" -eq 0 ] || { fail "$name: the whole run" "rc $rc" "$err"; continue; }
  cp -r "$T/every_$name" "$T/every_${name}_cut"
  rm -r "$T/every_${name}_cut"/checkpoints/step-000000{16,24}.safetensors \
    "$T/every_${name}_cut/summary.json"
  run train - --resume "$T/every_${name}_cut"
  same=1
  for s in 16 24; do
    cmp -s "$T/every_$name/checkpoints/step-000000$s.safetensors" \
      "$T/every_${name}_cut/checkpoints/step-000000$s.safetensors" || same=0
  done
  if [ "$rc" -eq 0 ] && [ "$same" -eq 1 ]; then pass; else
    fail "$name: killed after step 8 and resumed, the whole run's checkpoints byte for byte" "rc $rc" "$err"
  fi
  # and its metrics.jsonl is the whole run's but for the timings
  untimed() { sed -E 's/,"(samples_per_s|wall_s)":[0-9.]+//g' "$1/metrics.jsonl"; }
  if [ "$rc" -eq 0 ] && cmp -s <(untimed "$T/every_$name") <(untimed "$T/every_${name}_cut"); then
    pass
  else
    fail "$name: killed after step 8 and resumed, the whole run's metrics.jsonl" \
      "$(diff <(untimed "$T/every_$name") <(untimed "$T/every_${name}_cut"))"
  fi
  rm -rf "$T/every_$name" "$T/every_${name}_cut"
done

# --- 3. signals ---------------------------------------------------------------
# SIGINT or SIGTERM at a random moment (start-up, a step, an evaluation, a
# checkpoint write): the run stops after its step with a checkpoint and a
# summary marked interrupted, exits 130 or 143, leaves no temp file and
# keeps at most keep_checkpoints; the resumed run ends with the
# uninterrupted run's checkpoint, byte for byte.
sig=(--set data.train_limit=4096 --set data.test_limit=256 --set train.batch=32
     --set train.steps=1500 --set train.checkpoint_every=200 --set train.eval_every=500
     --set train.keep_checkpoints=2 --set metrics.progress=off --set train.threads=1)
final=checkpoints/step-00001500.safetensors
run train "$fc" "${sig[@]}" --out "$T/sig_ref"
[ "$rc" -eq 0 ] && pass || fail "uninterrupted run" "$err"
stopped=0
for i in $(seq 20); do
  dir="$T/sig_$i" name=INT want=130
  if [ $((i % 4)) -eq 0 ]; then name=TERM want=143; fi
  "$strata" train "$fc" "${sig[@]}" --out "$dir" >"$dir.out" 2>"$dir.err" &
  pid=$!
  # from the moment the run's directory exists (its handlers are set: a
  # signal before main() ends a process that has written nothing, with
  # nothing to resume)
  for _ in $(seq 100); do [ -d "$dir" ] && break; sleep 0.01; done
  sleep "$((RANDOM % 12 / 10)).$((RANDOM % 10))$((RANDOM % 10))"
  kill -s "$name" "$pid" 2>/dev/null
  wait "$pid"
  src=$?
  if [ "$src" -eq "$want" ]; then
    stopped=$((stopped + 1))
    if grep -q "^strata: stopped by SIG$name at step [0-9]* of 1500; wrote a checkpoint and summary.json; 'strata train - --resume $(re_quote "$dir")' continues it$" "$dir.err" &&
       grep -q "\"interrupted\": \"SIG$name\"" "$dir/summary.json" &&
       [ "$(checkpoints "$dir")" -le 2 ]; then
      pass
    else
      fail "SIG$name #$i: one line, a summary marked interrupted, at most 2 checkpoints" \
        "$(cat "$dir.err")" "$(ls "$dir/checkpoints")"
    fi
  elif [ "$src" -ne 0 ]; then
    fail "SIG$name #$i: exit $src, want $want (or 0 when it came after the end)" "$(cat "$dir.err")"
  fi
  no_stray "SIG$name #$i" "$dir"
  run train - --resume "$dir"
  if [ "$rc" -eq 0 ] && cmp -s "$T/sig_ref/$final" "$dir/$final" && [ "$(checkpoints "$dir")" -eq 2 ]; then
    pass
  else
    fail "SIG$name #$i (exit $src): resumed, the uninterrupted run's checkpoint byte for byte, 2 kept" \
      "rc $rc" "$err" "$(ls "$dir/checkpoints")"
  fi
  rm -rf "$dir"
done
if [ "$stopped" -ge 5 ]; then pass; else
  fail "the signals stopped only $stopped of 20 runs (the runs end too soon to test)"
fi
# A second signal ends the process at once: of SIGTERM and SIGINT sent
# together during a (long) step, the first asks for the stop and the second
# takes its own action; what was on disk resumes.
big=(--set data.train_limit=4096 --set data.test_limit=256 --set train.batch=256
     --set 'model.hidden=[4096,4096]' --set train.steps=40 --set train.checkpoint_every=2
     --set metrics.progress=off)
"$strata" train "$fc" "${big[@]}" --out "$T/twice" >"$T/twice.out" 2>"$T/twice.err" &
pid=$!
for _ in $(seq 300); do [ "$(checkpoints "$T/twice")" -ge 1 ] && break; sleep 0.05; done
kill -TERM "$pid"
kill -INT "$pid"
wait "$pid"
src=$?
# (two signals pending at once are delivered lowest number first: either
# may be the second)
if { [ "$src" -eq 130 ] || [ "$src" -eq 143 ]; } && ! grep -q "stopped by" "$T/twice.err"; then
  pass
else
  fail "a second signal ends the run at once" "exit $src" "$(cat "$T/twice.err")"
fi
run train - --resume "$T/twice" --set train.steps=6
if [ "$rc" -eq 0 ] && ! find "$T/twice" -name '*.tmp*' | grep -q .; then pass; else
  fail "after a second signal the run resumes, and start-up removed any temp file" "rc $rc" "$err"
fi
# A config read from a FIFO that no one writes: one SIGTERM ends the wait
# (nothing is written before the config is read, so the default action).
mkfifo "$T/fifo.yaml"
"$strata" train "$T/fifo.yaml" --out "$T/fifo_run" >/dev/null 2>"$T/fifo.err" &
pid=$!
sleep 0.3
kill -TERM "$pid"
for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$pid" 2>/dev/null; then
  kill -9 "$pid"
  fail "one SIGTERM ends a train waiting to open its config" "still running after 5 s"
else
  wait "$pid"
  src=$?
  if [ "$src" -eq 143 ] && [ ! -e "$T/fifo_run" ]; then pass; else
    fail "one SIGTERM ends a train waiting to open its config, writing nothing" "exit $src" "$(cat "$T/fifo.err")"
  fi
fi
# The newest checkpoint is found by its name: one that holds another step
# (renamed) is refused, naming both steps and the older one to go back to.
run train "$fc" "${small[@]}" --set train.steps=20 --set train.checkpoint_every=10 --out "$T/renamed"
mv "$T/renamed/checkpoints/step-00000010.safetensors" "$T/renamed/checkpoints/step-00000030.safetensors"
run train - --resume "$T/renamed" --set train.steps=40
if [ "$rc" -eq 1 ] && grep -q "step-00000030.safetensors: holds step 10, but its name says step 30: a renamed or misplaced checkpoint; the older .*step-00000020.safetensors is there to go back to" <<<"$err"; then
  pass
else
  fail "a renamed checkpoint is refused on resume, naming both steps" "rc $rc" "$err"
fi
# A name the run would not write (step-9 for step-00000009) is none of its
# checkpoints: the resume takes the newest it wrote. The listing took it as
# step 9 and the resume then opened step-00000009.safetensors, which is not
# there ("cannot open: No such file or directory").
run train "$fc" "${small[@]}" --set train.steps=10 --set train.checkpoint_every=5 --out "$T/short_name"
cp "$T/short_name/checkpoints/step-00000005.safetensors" "$T/short_name/checkpoints/step-9.safetensors"
mkdir "$T/short_name/checkpoints/step-11"
: >"$T/short_name/checkpoints/step-11/model.safetensors.index.json"
run train - --resume "$T/short_name" --set train.steps=15
if [ "$rc" -eq 0 ] && grep -q "resumed from .*/step-00000010.safetensors at step 10" <<<"$out"; then
  pass
else
  fail "a checkpoint not named as the run names them is not taken on resume" "rc $rc" "$err"
fi

# --- 4. stale temp files and pruning ------------------------------------------
# a temp file of a dead process goes, one of a live process stays; pruning
# keeps exactly keep_checkpoints whatever was left before
dead=999999
while kill -0 "$dead" 2>/dev/null; do dead=$((dead - 1)); done
run train "$fc" "${small[@]}" --set train.steps=10 --set train.checkpoint_every=5 --out "$T/prune"
for s in 1 2 3; do
  cp "$T/prune/checkpoints/step-00000010.safetensors" "$T/prune/checkpoints/step-0000000$s.safetensors"
done
: >"$T/prune/checkpoints/step-00000012.safetensors.tmp.$dead"
: >"$T/prune/summary.json.tmp.$dead"
: >"$T/prune/summary.json.tmp.$$"
run train - --resume "$T/prune" --set train.steps=20
if [ "$rc" -eq 0 ] && [ "$(ls "$T/prune/checkpoints" | tr '\n' ' ')" = "step-00000015.safetensors step-00000020.safetensors " ] &&
   [ ! -e "$T/prune/summary.json.tmp.$dead" ] && [ -e "$T/prune/summary.json.tmp.$$" ]; then
  pass
else
  fail "start-up removes dead temp files; pruning keeps the newest 2" "rc $rc" "$err" "$(ls -a "$T/prune" "$T/prune/checkpoints")"
fi

# --- 5. found before the first step -------------------------------------------
# 30 layers of 45000 (each tensor under 2^31 elements, as every one must be)
huge="model.hidden=[$(printf '45000,%.0s' $(seq 29))45000]"
expect_error "a model larger than the machine" \
  "^strata: error: $(re_quote "$fc"): the model needs at least 705 GB \(weights 235 GB, gradients 235 GB, optimizer state 235 GB, activations 173 MB at micro-batch 32\), more than the .* this machine allows .*; refused before allocating$" \
  train "$fc" "${small[@]}" --set "$huge" --set train.steps=1 --out "$T/huge"
if [ ! -e "$T/huge" ]; then pass; else
  fail "a run refused before its first step leaves no folder" "$(ls -R "$T/huge")"; fi
# pipelined backprop's stages hold micro-batches in flight (stage 0 of 32:
# 63 of them), which the model's own check does not count: refused at
# start, naming the stage, not killed by the kernel while allocating
deep="model.hidden=[$(printf '4096,%.0s' $(seq 30))4096]"
expect_error "pipelined backprop's micro-batches in flight larger than the machine" \
  "^strata: error: pipelined backprop needs at least 145 GB: stage 0 alone holds 8.47 GB \(63 micro-batches of 4096 samples in flight, and its weight versions\), more than the .* this machine allows .*; refused before allocating$" \
  train configs/pb_mlp_fmnist.yaml --set data.dataset=synthetic --set data.train_limit=4096 \
  --set data.test_limit=128 --set "$deep" --set train.batch=4096 --set execution.micro_batch=4096 \
  --set execution.stages=32 --set train.steps=1 --out "$T/pbdeep"
# ... and takes back only what it made: a plan compile wrote there stays
run compile "$fc" --out "$T/hugeplan"
run train "$fc" "${small[@]}" --set "$huge" --set train.steps=1 --out "$T/hugeplan"
if [ "$rc" -eq 1 ] && [ "$(ls "$T/hugeplan" | tr '\n' ' ')" = "plan.json plan.svg " ]; then pass; else
  fail "a refused run leaves the plan compile wrote in its folder" "rc $rc" "$(ls -R "$T/hugeplan")"; fi
expect_error "a trace in a missing folder" \
  "^strata: error: $(re_quote "$T/nowhere/t.json"): cannot write: No such file or directory$" \
  train "$fc" "${small[@]}" --set train.steps=2 --trace "$T/nowhere/t.json" --out "$T/trace"
if [ ! -e "$T/trace" ]; then pass; else fail "a trace path is checked before the first step, and the folder taken back" "$(ls -R "$T/trace")"; fi
mkdir -p "$T/noplan/plan.json"
expect_error "a plan that cannot be written" \
  "^strata: error: $(re_quote "$T/noplan/plan.json"): .*(Is a directory|rename)" \
  train "$fc" "${small[@]}" --set train.steps=2 --out "$T/noplan"
# a full disk under metrics.jsonl: the run stops naming the file, after a
# final checkpoint
mkdir -p "$T/full"
ln -s /dev/full "$T/full/metrics.jsonl"
expect_error "metrics.jsonl on a full disk" \
  "^strata: error: $(re_quote "$T/full")/metrics.jsonl: cannot write: No space left on device$" \
  train "$fc" "${small[@]}" --set train.steps=40 --set metrics.log_every=5 --out "$T/full"
if [ "$(ls "$T/full/checkpoints")" = "step-00000005.safetensors" ]; then pass; else
  fail "a run whose log cannot be written saves a checkpoint" "$(ls "$T/full/checkpoints")"
fi
# a log torn mid-line ends at its last whole line before a resume appends
printf '{"type":"train","st' >>"$T/prune/metrics.jsonl"
run train - --resume "$T/prune" --set train.steps=25
if [ "$rc" -eq 0 ] && python3 -c 'import json,sys; [json.loads(l) for l in open(sys.argv[1])]' "$T/prune/metrics.jsonl"; then
  pass
else
  fail "a torn metrics line is dropped on resume" "rc $rc" "$(tail -n 3 "$T/prune/metrics.jsonl")"
fi

# a resume from an older checkpoint (the newest removed, as a failed write
# leaves it) drops the log's lines past it: step 25 is logged once
rm "$T/prune/checkpoints/step-00000025.safetensors"
run train - --resume "$T/prune" --set train.steps=25
n25=$(grep -c '"type":"train","step":25,' "$T/prune/metrics.jsonl")
if [ "$rc" -eq 0 ] && [ "$n25" -eq 1 ] &&
   python3 -c 'import json,sys; s=[json.loads(l)["step"] for l in open(sys.argv[1])]; sys.exit(s != sorted(s))' "$T/prune/metrics.jsonl"; then
  pass
else
  fail "a resume from an older checkpoint drops the log past it" "rc $rc" "$err" "$(cat "$T/prune/metrics.jsonl")"
fi
# --- 6. weight streaming: config.yaml first -----------------------------------
# killed as soon as config.yaml exists (perhaps before its store): resumes
ws=(--set data.train_limit=1024 --set data.test_limit=64 --set train.steps=100
    --set train.batch=64 --set metrics.progress=off
    --set execution.mode=weight_streaming --set execution.store=file)
"$strata" train "$fc" "${ws[@]}" --out "$T/wsk" >/dev/null 2>&1 &
pid=$!
for _ in $(seq 2000); do [ -e "$T/wsk/config.yaml" ] && break; sleep 0.005; done
kill -9 "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
run train - --resume "$T/wsk"
if [ "$rc" -eq 0 ] && grep -q "^strata: \(resumed from the store\|.*no checkpoint yet\)" <<<"$out"; then pass; else
  fail "a weight-streaming run killed at once resumes" "rc $rc" "$out" "$err"
fi
# a checkpointed run killed before its first checkpoint: from step 0
mkdir -p "$T/early"
cp "$T/first.config" "$T/early/config.yaml"
run train - --resume "$T/early" --set train.steps=20 --set train.seed=42
if [ "$rc" -eq 0 ] && grep -q "no checkpoint yet (the run stopped before its first); starting at step 0" <<<"$out"; then
  pass
else
  fail "--resume of a run with no checkpoint yet starts at step 0" "rc $rc" "$out" "$err"
fi

# --- 7. checkpoint metadata and weights ---------------------------------------
ck="$T/whole/checkpoints/step-00000020.safetensors"
# edit NAME KEY VALUE: a copy of $ck with one metadata value replaced
edit() {
  python3 - "$ck" "$T/meta/checkpoints/step-00000020.safetensors" "$1" "$2" <<'PY'
import json, struct, sys
src, dst, key, value = sys.argv[1:]
data = open(src, "rb").read()
n = struct.unpack("<Q", data[:8])[0]
head = json.loads(data[8:8 + n])
head["__metadata__"][key] = value
text = json.dumps(head).encode()
text += b" " * (-len(text) % 8)
open(dst, "wb").write(struct.pack("<Q", len(text)) + text + data[8 + n:])
PY
}
rm -rf "$T/meta" && cp -r "$T/whole" "$T/meta"
edit step 99999999999999999999999
expect_error "a step past int64" \
  "^strata: error: $(re_quote "$T/meta/checkpoints/step-00000020.safetensors"): metadata 'step' is 99999999999999999999999, out of range: corrupt checkpoint; the older .*step-00000010.safetensors is there to go back to \(move the damaged one aside\)$" \
  train - --resume "$T/meta" --set train.steps=30
edit step 21
expect_error "a step that does not match the samples" \
  "^strata: error: .*step-00000020.safetensors: metadata step 21, epoch 1, epoch_pos 128 and samples 640 do not describe one position at batch 32 over 512 samples: corrupt checkpoint; the older .*step-00000010.safetensors is there to go back to \(move the damaged one aside\)$" \
  train - --resume "$T/meta" --set train.steps=30
rm -rf "$T/meta" && cp -r "$T/whole" "$T/meta"
expect_error "a checkpoint past the run's steps" \
  "^strata: error: .*step-00000020.safetensors: at step 20, past this run's last step 10 \(set by --set\): raise train.steps to continue it$" \
  train - --resume "$T/meta" --set train.steps=10
# the run's length set by train.epochs (train.steps 0): that key to raise
expect_error "a checkpoint past the run's epochs" \
  "^strata: error: .*step-00000020.safetensors: at step 20, past this run's last step 16 \(set by --set\): raise train.epochs to continue it$" \
  train - --resume "$T/meta" --set train.steps=0 --set train.epochs=1
# a damaged newest checkpoint names the older one to go back to
rm -rf "$T/dmg" && cp -r "$T/whole" "$T/dmg"
python3 -c 'import sys; p=sys.argv[1]; b=bytearray(open(p,"rb").read()); b[-100]^=1; open(p,"wb").write(b)' \
  "$T/dmg/checkpoints/step-00000020.safetensors"
expect_error "a damaged newest checkpoint names the older one" \
  "^strata: error: .*step-00000020.safetensors: tensor '.*' is damaged: .*; the older $(re_quote "$T/dmg")/checkpoints/step-00000010.safetensors is there to go back to \(move the damaged one aside\)$" \
  train - --resume "$T/dmg" --set train.steps=30
# a config that is not the run's (another width, optimizer) refuses every
# checkpoint alike: the older one is no way back, and the newest is not
# called damaged (it was: "move the damaged one aside")
rm -rf "$T/other" && cp -r "$T/whole" "$T/other"
expect_error "a resume under another model does not call the checkpoint damaged" \
  "^strata: error: $(re_quote "$T/other")/checkpoints/step-00000020.safetensors: tensor 'blocks.0.linear0.weight' is F32 [0-9x]+, the model needs F32 [0-9x]+; the older $(re_quote "$T/other")/checkpoints/step-00000010.safetensors is refused too: it is the config that differs from the run's$" \
  train - --resume "$T/other" --set train.steps=30 --set 'model.hidden=[64,64]'
expect_error "a resume under another optimizer does not call the checkpoint damaged" \
  "^strata: error: .*step-00000020.safetensors: holds sgd optimizer state but the config asks for adamw \(optimizer.kind\); the older .*step-00000010.safetensors is refused too: it is the config that differs from the run's$" \
  train - --resume "$T/other" --set train.steps=30 --set optimizer.kind=adamw --set optimizer.nesterov=false \
  --set optimizer.reference_batch=0
# a run that diverges names its newest checkpoint
expect_error "a diverged run names its newest checkpoint" \
  "^strata: error: step [0-9]+: training loss is (NaN|infinite) .*no checkpoint written — lower optimizer.lr; the newest checkpoint, $(re_quote "$T/div")/checkpoints/step-[0-9]{8}.safetensors, is there to go back to$" \
  train "$fc" "${small[@]}" --set train.steps=300 --set optimizer.lr=3 --set train.checkpoint_every=2 \
  --set train.keep_checkpoints=0 --out "$T/div"
# diverged in the last update, after the last checked loss: the final
# evaluation says so (its loss is not finite), and no checkpoint of those
# weights is written (nor a summary.json with a NaN, which JSON cannot hold)
expect_error "a run whose last update diverges" \
  "^strata: error: step 1: the test loss is (NaN|infinite): the model diverged in its last updates; stopped, no checkpoint written — lower optimizer.lr$" \
  train "$fc" "${small[@]}" --set train.steps=1 --set optimizer.lr=1e30 --out "$T/div_last"
if [ -z "$(ls "$T/div_last/checkpoints")" ] && [ ! -e "$T/div_last/summary.json" ]; then pass; else
  fail "a run whose last update diverged: no checkpoint, no summary" "$(ls -R "$T/div_last")"
fi
# a file store commits every step: it holds the diverged weights, and the
# message says so (not "no checkpoint written": a resume evaluates them again)
expect_error "a store run whose last update diverges" \
  "^strata: error: step 1: the test loss is (NaN|infinite): the model diverged in its last updates; stopped, but the store $(re_quote "$T/div_ws")/store.strata holds these weights \(committed with the step\) — lower optimizer.lr and start afresh \(a resume evaluates them again\)$" \
  train "$fc" "${small[@]}" --set train.steps=1 --set optimizer.lr=1e30 \
  --set execution.mode=weight_streaming --set execution.store=file --out "$T/div_ws"
# a NaN weight: eval and generate name the tensor
# poison SRC DST TENSOR: DST is SRC with element 7 of TENSOR a NaN, its
# CRC-32 in the metadata made to match, as a diverged run writes it (a
# damaged file, caught by the CRC, is test_safetensors' concern)
poison() {
  python3 - "$@" <<'PY'
import json, struct, sys, zlib
data = bytearray(open(sys.argv[1], "rb").read())
n = struct.unpack("<Q", data[:8])[0]
header = json.loads(data[8:8 + n])
t = header[sys.argv[3]]
b, e = t["data_offsets"]
at = 8 + n + b + 4 * 7
data[at:at + 4] = struct.pack("<f", float("nan"))
crcs = header["__metadata__"]["strata.crc32"]
names = [k for k in header if k != "__metadata__"]
new = crcs.split(",")
new[names.index(sys.argv[3])] = "%08x" % zlib.crc32(data[8 + n + b:8 + n + e])
old_text, new_text = crcs.encode(), ",".join(new).encode()
assert len(old_text) == len(new_text) and data[8:8 + n].count(old_text) == 1
data[8:8 + n] = data[8:8 + n].replace(old_text, new_text)
open(sys.argv[2], "wb").write(data)
PY
}
poison "$ck" "$T/nan.safetensors" blocks.1.linear0.weight
expect_error "eval of a NaN weight" \
  "^strata: error: $(re_quote "$T/nan.safetensors"): tensor 'blocks.1.linear0.weight' holds NaN at element 7: the run that wrote it had diverged$" \
  eval "$fc" "${small[@]}" --checkpoint "$T/nan.safetensors"
for i in $(seq 1 200); do echo "line $i: the quick brown fox $((i * 7 % 13))"; done >"$T/corpus.txt"
gpt=(--set model.kind=gpt --set data.dataset=text --set data.path="$T/corpus.txt"
     --set model.context=16 --set model.layers=1 --set model.heads=2
     --set model.width=16 --set train.batch=4 --set train.steps=2 --set metrics.progress=off)
run train "$fc" "${gpt[@]}" --out "$T/gpt"
first=$(python3 -c 'import json,struct,sys; d=open(sys.argv[1],"rb").read(); n=struct.unpack("<Q",d[:8])[0]; print([k for k in json.loads(d[8:8+n]) if k.endswith("weight")][0])' "$T/gpt/checkpoints/step-00000002.safetensors")
poison "$T/gpt/checkpoints/step-00000002.safetensors" "$T/gnan.safetensors" "$first"
expect_error "generate from a NaN weight" \
  "^strata: error: $(re_quote "$T/gnan.safetensors"): tensor '$(re_quote "$first")' holds NaN at element 7: the run that wrote it had diverged$" \
  generate "$fc" "${gpt[@]}" --checkpoint "$T/gnan.safetensors" --prompt "line" --tokens 5
finish
