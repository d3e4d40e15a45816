#!/usr/bin/env bash
# test_cli.sh — the `strata` command seen from outside: failure paths (bad
# YAML, unknown keys, wrong types, impossible shapes, missing and corrupt data,
# truncated checkpoints, a diverging run) and the happy paths (help texts, a
# tiny training run and the files it writes, eval, inspect).
#
# Every failure must end in exit status 1 and exactly ONE line on stderr,
# "strata: error: PLACE: CAUSE", where PLACE is a file (with line:col for a
# config), a --set option or a tensor, and a failed run must leave no
# half-written file (*.tmp*) behind: writes are atomic (STYLE.md, SQLite).
#
# Run from the repo root by tools/run-tests.sh, which sets STRATA_BUILD; ends
# with the closing line "N passed, N failed". Each run is tiny (512 training
# samples, 20 steps) so the whole file takes a few seconds.
. "$(dirname "$0")/../harness.sh"


# expect_error NAME ERE -- ARGS...: strata ARGS must exit 1 and print exactly
# one stderr line "strata: error: ..." matching the extended regex ERE (which
# must say where and why). Counts two checks: the status and the message.
expect_error() {
  local name=$1 ere=$2
  shift 3
  run "$@"
  if [ "$rc" -eq 1 ]; then pass; else
    fail "$name: exit status" "strata $*" "want 1, got $rc" "stderr: $err"
  fi
  local lines
  lines=$(wc -l <"$T/stderr")
  if [ "$lines" -eq 1 ] && [[ $err =~ ^strata:\ error:\  ]] &&
    [[ $err =~ $ere ]]; then
    pass
  else
    fail "$name: message" "strata $*" "want one line matching: strata: error: $ere" \
      "got $lines line(s):" "$(sed 's/^/  | /' "$T/stderr")"
  fi
}

# no_tmp_left NAME DIR: a failed run leaves no half-written file in DIR.
no_tmp_left() {
  local left
  left=$(find "$2" -name '*.tmp*' 2>/dev/null)
  if [ -z "$left" ]; then pass; else
    fail "$1: temporary files left behind under $2" "$left"
  fi
}

# valid_jsonl NAME FILE: every line of FILE parses as JSON.
valid_jsonl() {
  local why
  if why=$(python3 -c 'import json,sys; [json.loads(l) for l in open(sys.argv[1])]' "$2" 2>&1); then
    pass
  else
    fail "$1: $2 is not valid JSON lines" "$why"
  fi
}

fc=configs/fc_mnist.yaml
small=(--set data.train_limit=512 --set data.test_limit=256
  --set train.steps=20 --set train.batch=32 --set metrics.progress=off)

# --- 1. malformed YAML --------------------------------------------------------
printf 'model: [unclosed\n' >"$T/bad.yaml"
expect_error "malformed yaml" \
  "$(re_quote "$T/bad.yaml"):[0-9]+:[0-9]+: .*(YAML|syntax)" \
  -- train "$T/bad.yaml" --out "$T/o_bad"

# --- 2. unknown key -----------------------------------------------------------
printf 'model:\n  hiden: [1]\n' >"$T/unknown.yaml"
expect_error "unknown key" \
  "$(re_quote "$T/unknown.yaml"):2:3: .*unknown key.*model\.hiden" \
  -- train "$T/unknown.yaml" --out "$T/o_unknown"

# --- 3. wrong type, unknown --set key, wrong --set type -----------------------
printf 'optimizer:\n  lr: fast\n' >"$T/type.yaml"
expect_error "wrong type" \
  "$(re_quote "$T/type.yaml"):2:7: optimizer\.lr: .*number.*fast" \
  -- train "$T/type.yaml" --out "$T/o_type"
expect_error "unknown --set key" \
  "--set train\.nope=1: .*unknown key.*train\.nope" \
  -- train "$fc" --set train.nope=1 --out "$T/o_nope"
expect_error "wrong --set type" \
  "--set optimizer\.lr=fast: optimizer\.lr: .*number.*fast" \
  -- train "$fc" --set optimizer.lr=fast --out "$T/o_settype"
printf 'optimizer:\n  kind: adam\n' >"$T/enum.yaml"
expect_error "bad enum value" \
  "$(re_quote "$T/enum.yaml"):2:9: optimizer\.kind: .*adam.*sgd, adamw" \
  -- train "$T/enum.yaml" --out "$T/o_enum"
expect_error "missing config file" \
  "$(re_quote "$T/none.yaml"): cannot open: No such file" \
  -- train "$T/none.yaml" --out "$T/o_none"

# --- 4. impossible shape ------------------------------------------------------
# 28 -> 14 -> 7 -> 3 -> 1 -> 0: the fifth pooling leaves no pixel.
printf 'model:\n  kind: cnn\n  channels: [4, 4, 4, 4, 4, 4]\n' >"$T/shape.yaml"
expect_error "impossible shape" \
  "$(re_quote "$T/shape.yaml"):3:13: model\.channels: .*(below 1x1|too many)" \
  -- train "$T/shape.yaml" --out "$T/o_shape"
expect_error "impossible shape via --set" \
  "--set.*model\.channels: .*(below 1x1|too many)" \
  -- train "$fc" --set model.kind=cnn --set 'model.channels=[4,4,4,4,4,4]' \
  --out "$T/o_shape_set"

# --- 5. missing dataset -------------------------------------------------------
# named by the key that gives the path and where it was set (and a
# relative path said to be read from the working directory: a run's
# config.yaml, resumed from another folder)
expect_error "missing dataset" \
  "^strata: error: --set: data.dir: /nonexistent/[a-z0-9-]+\.gz: cannot open: No such file or directory$" \
  -- train "$fc" "${small[@]}" --set data.dir=/nonexistent --out "$T/o_nodata"
expect_error "missing corpus, a relative path" \
  "^strata: error: --set: data.path: no-such-corpus\.txt: cannot open: No such file or directory \(a relative path: read from the working directory\)$" \
  -- train configs/gpt_tiny.yaml --set data.path=no-such-corpus.txt --out "$T/o_nocorpus"

# --- 6. corrupt and truncated gzip --------------------------------------------
# The whole training file is read (no train_limit): a load with a limit stops
# early and, by design (src/data/idx.c), trusts the bytes it read, so it never
# reaches the gzip CRC in the trailer.
mkdir "$T/corrupt" "$T/short"
cp /usr/share/datasets/fashion-mnist/*.gz "$T/corrupt/"
cp /usr/share/datasets/fashion-mnist/*.gz "$T/short/"
images=train-images-idx3-ubyte.gz
size=$(stat -c %s "$T/corrupt/$images")
head -c 4096 /dev/zero | tr '\0' '\377' |
  dd of="$T/corrupt/$images" bs=4096 seek=$((size / 2)) oflag=seek_bytes \
    conv=notrunc status=none
expect_error "corrupt gzip" \
  "$(re_quote "$T/corrupt/$images"): .*corrupt" \
  -- train "$fc" --set data.test_limit=256 --set train.steps=2 \
  --set metrics.progress=off --set data.dir="$T/corrupt" --out "$T/o_corrupt"
head -c $((size / 2)) "/usr/share/datasets/fashion-mnist/$images" >"$T/short/$images"
expect_error "truncated gzip" \
  "$(re_quote "$T/short/$images"): .*truncated" \
  -- train "$fc" --set data.test_limit=256 --set train.steps=2 \
  --set metrics.progress=off --set data.dir="$T/short" --out "$T/o_short"

# --- 10. happy paths ----------------------------------------------------------
run --help
if [ "$rc" -eq 0 ] && [[ $out == *"usage: strata COMMAND"* ]]; then pass; else
  fail "strata --help" "rc=$rc" "$out$err"
fi
run train --help
if [ "$rc" -eq 0 ] && grep -Eq '^ +optimizer\.lr +float +0\.05 ' "$T/stdout" &&
  grep -Eq '^ +train\.batch +int +32 ' "$T/stdout"; then pass; else
  fail "strata train --help lists keys with defaults" "rc=$rc" "$out$err"
fi
run eval --help
if [ "$rc" -eq 0 ] && [[ $out == *"--checkpoint"* ]]; then pass; else
  fail "strata eval --help" "rc=$rc" "$out$err"
fi
run inspect --help
if [ "$rc" -eq 0 ] && [[ $out == *"usage: strata inspect"* ]]; then pass; else
  fail "strata inspect --help" "rc=$rc" "$out$err"
fi
run bogus
if [ "$rc" -eq 2 ] && [[ $err == *"unknown command 'bogus'"* ]]; then pass; else
  fail "unknown command exits 2" "rc=$rc" "$err"
fi
run
if [ "$rc" -eq 2 ]; then pass; else fail "no command exits 2" "rc=$rc"; fi
run train "$fc" --bogus
if [ "$rc" -eq 2 ] && [[ $err == *"unknown option '--bogus'"* ]]; then pass; else
  fail "unknown option exits 2" "rc=$rc" "$err"
fi
# misuse: the cause on the first line, then the synopsis alone (not all 50
# lines of train's help) and where the rest is
if [ "$(head -n 1 <<<"$err")" = "strata: error: unknown option '--bogus'" ] &&
   [ "$(sed -n 2p <<<"$err")" = "usage: strata train CONFIG [--set key.path=value ...] [--out DIR]" ] &&
   [ "$(tail -n 1 <<<"$err")" = "(strata train --help: every option)" ] &&
   [ "$(wc -l <<<"$err")" -eq 4 ]; then pass; else
  fail "a usage error is the cause, the synopsis and a pointer to --help" "$err"
fi
# an option where a value belongs is not taken as the value
run train "$fc" --set --out "$T/o_swallow"
if [ "$rc" -eq 2 ] && [ "$(head -n 1 <<<"$err")" = "strata: error: --set needs a value before the option '--out'" ] &&
   [ ! -e "$T/o_swallow" ]; then pass; else
  fail "--set --out DIR: --set lacks its value" "rc=$rc" "$err"
fi
run train "$fc" --out --overwrite
if [ "$rc" -eq 2 ] && [ "$(head -n 1 <<<"$err")" = "strata: error: --out needs a value before the option '--overwrite'" ] &&
   [ ! -e ./--overwrite ]; then pass; else
  fail "--out --overwrite: --out lacks its value" "rc=$rc" "$err"
  rm -rf -- ./--overwrite # what the bug made, not left in the checkout
fi

run_dir="$T/run"
run train "$fc" "${small[@]}" --out "$run_dir"
if [ "$rc" -eq 0 ] && [ -z "$err" ]; then pass; else
  fail "tiny training run" "rc=$rc" "$out" "$err"
fi
for f in config.yaml metrics.jsonl summary.json plan.json plan.svg; do
  if [ -s "$run_dir/$f" ]; then pass; else fail "run wrote $f" "$(ls -la "$run_dir")"; fi
done
valid_jsonl "metrics.jsonl" "$run_dir/metrics.jsonl"
if why=$(python3 - "$run_dir/summary.json" 2>&1 <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
need = ["mode", "steps", "samples", "train_loss", "test_accuracy",
        "samples_per_s", "wall_s"]
missing = [k for k in need if k not in s]
assert not missing, "missing keys %s in %s" % (missing, s)
assert s["steps"] == 20, "steps %r, want 20" % s["steps"]
assert s["samples"] == 20 * 32, "samples %r, want 640" % s["samples"]
assert 0 <= s["test_accuracy"] <= 1, s["test_accuracy"]
EOF
); then pass; else fail "summary.json" "$why"; fi
no_tmp_left "tiny training run" "$run_dir"

# The kernel per product class: a one-pass profile of this machine
# (bench --calibrate --passes 1) measures the packed kernel and the BLAS,
# and a run under it says it chose as measured; without one, by the rule.
grep -q '"gemm_kernels": "packed kernel or the BLAS by the built-in rule"' \
  "$run_dir/summary.json" && pass || fail "summary.json: gemm_kernels by the rule" \
  "$(grep gemm_kernels "$run_dir/summary.json")"
# (a build without FMA has no packed kernel: nothing to measure, the rule)
run bench --calibrate --threads 1 --passes 1 --out "$T/cal.json"
printf '%s\n' "$out" >"$T/cal_out"
chose="as measured by the calibration profile" keys=1
[[ $out == *"packed"*"BLAS"* ]] || chose="by the built-in rule" keys=0
if [ "$rc" -eq 0 ] && [ "$(grep -c '"gemm_choice_packed": \[\|"gemm_choice_blas": \[' "$T/cal.json")" -eq $((2 * keys)) ] &&
  [[ $out == *"calibrating on 1 thread"*", 1 pass"* ]]; then pass; else
  fail "bench --calibrate --passes 1 writes the kernel rates it measured" "rc=$rc" "$out" "$err"
fi
# its memory bandwidth: stored for its one thread and planned with,
# said so; or, were the figure no memory's, not stored and said so
membw=$(grep -c '"memory_bandwidth": \[[0-9.e+]*\],' "$T/cal.json")
STRATA_CALIBRATION="$T/cal.json" run compile "$fc" --out "$T/o_cal"
if [ "$rc" -eq 0 ] && { { [ "$membw" -eq 1 ] && grep -q "^fabric: .*; memory [0-9.]* [GMT]B/s (calibrated) past" <<<"$out" &&
       grep -q '"memory_bandwidth_source": "calibrated"' "$T/o_cal/plan.json"; } ||
     { [ "$membw" -eq 0 ] && grep -q "memory     ignored" "$T/cal_out" 2>/dev/null; }; }; then pass; else
  fail "a one-pass profile's memory bandwidth, and the plan under it" "rc=$rc" "$out" "$(cat "$T/cal.json")"
fi
# plan.json and plan.svg stay valid UTF-8 (U+FFFD for a bad byte) where a
# path is not: a config and a profile in a folder named with a byte 0xff
# and then 120 two-byte characters, so that fabric.source's 200 bytes of
# the profile's path end mid-character
odd="$T/"
(((200 - $(printf %s "$odd" | wc -c) - 1) % 2 == 0)) && odd+=a
odd+=$'\xff'$(printf '\xc3\xa9%.0s' {1..120})
mkdir -p "$odd" && cp "$T/cal.json" "$fc" "$odd/"
STRATA_CALIBRATION="$odd/cal.json" run compile "$odd/$(basename "$fc")" --out "$T/o_odd"
if [ "$rc" -eq 0 ] && python3 -c '
import json, sys, xml.dom.minidom
plan = json.load(open(sys.argv[1], encoding="utf-8"))
assert "\ufffd" in plan["config"] and plan["fabric"]["source"].count("\ufffd") == 2
xml.dom.minidom.parse(sys.argv[2])' "$T/o_odd/plan.json" "$T/o_odd/plan.svg"; then pass; else
  fail "plan.json and plan.svg from paths not UTF-8" "rc=$rc" "$err"
fi
STRATA_CALIBRATION="$T/cal.json" run train "$fc" "${small[@]}" --set train.steps=2 \
  --out "$T/run_cal"
if [ "$rc" -eq 0 ] && grep -q "\"gemm_kernels\": \"packed kernel or the BLAS [a-z, ]*$chose\"" \
  "$T/run_cal/summary.json"; then pass; else
  fail "a run under a profile chooses kernels $chose" "rc=$rc" "$err" \
    "$(grep gemm_kernels "$T/run_cal/summary.json" 2>/dev/null)"
fi
# bf16 under a profile whose bf16 products (the instruction 1, the
# emulation 2 GFLOP/s) ran slower than fp32's: a bf16 run says so, with
# the emulation's figure while subnormals are flushed (the default), the
# instruction's with them kept where the build has it
if [ "$keys" -eq 1 ]; then
  sed -E 's/"gemm_bf16": \[[^]]*\]/"gemm_bf16": [1e9, 2e9]/' "$T/cal.json" >"$T/cal_bf16.json"
  STRATA_CALIBRATION="$T/cal_bf16.json" run train "$fc" "${small[@]}" --set train.steps=2 \
    --set train.precision=bf16 --out "$T/run_bf16cal"
  flushed=$out
  STRATA_CALIBRATION="$T/cal_bf16.json" run train "$fc" "${small[@]}" --set train.steps=2 \
    --set train.precision=bf16 --set train.flush_subnormals=false --out "$T/run_bf16kept"
  # AMX's tiles, where they run, take no preference: the instruction's 1
  # both ways
  kept=2 want=2
  [[ $flushed == *"AVX512-BF16"* || $flushed == *"measured them faster"* ]] && kept=1
  [[ $flushed == *"fp32 master weights; AMX tiles (tdpbf16ps)"* ]] && kept=1 want=1
  notice="strata: notice: on this CPU bf16's products ran slower than fp32's"
  if grep -q '"gemm_bf16": \[1e9, 2e9\]' "$T/cal_bf16.json" && [ "$rc" -eq 0 ] &&
    grep -qF "$notice ($want against " <<<"$flushed" && grep -qF "$notice ($kept against " <<<"$out" &&
    { [ "$kept" -eq 2 ] || [ "$want" -eq 1 ] || grep -q "fp32 master weights; emulated (.*measured them faster than this CPU's vdpbf16ps)" <<<"$flushed"; }; then
    pass
  else
    fail "a bf16 run under a profile that measured bf16 slower says so" "rc=$rc" "$flushed" "$out" "$err"
  fi
fi
# STRATA_BF16_TILES=0: the definition's kernel where AMX's tiles would run
# (on a CPU without them the run names its kernel as always)
STRATA_BF16_TILES=0 run train "$fc" "${small[@]}" --set train.steps=2 \
  --set train.precision=bf16 --out "$T/run_notiles"
if [ "$rc" -eq 0 ] && [[ $out == *"fp32 master weights; "* ]] && [[ $out != *"AMX tiles"* ]]; then
  pass
else
  fail "STRATA_BF16_TILES=0 keeps AMX's tiles off" "rc=$rc" "$out" "$err"
fi
# bf16's notice of few rows per product counts the samples one product
# takes: pipelined backprop's default micro-batch of one sample, a
# replica's share of the batch (it said nothing of either at batch 32)
rows_notice="strata: notice: 1 row per product: bf16 is slower than fp32"
run train configs/pb_mlp_fmnist.yaml --set data.dataset=synthetic "${small[@]}" \
  --set train.steps=1 --set train.precision=bf16 --out "$T/run_bf16pb"
pb_out=$out
run train "$fc" "${small[@]}" --set train.steps=1 --set execution.replicas=4 \
  --set train.precision=bf16 --out "$T/run_bf16rep"
if [ "$rc" -eq 0 ] && grep -qF "$rows_notice" <<<"$pb_out" &&
  grep -qF "strata: notice: 8 rows per product: bf16 is slower than fp32" <<<"$out"; then
  pass
else
  fail "bf16's few-rows notice counts a micro-batch of pipelined backprop or a replica" \
    "rc=$rc" "$pb_out" "$out" "$err"
fi
# the machine's state now: a round trip over 2 threads, a positive time
run bench --probe --threads 2
if [ "$rc" -eq 0 ] && [[ $out =~ ^round\ trip\ on\ 2\ threads:\ ([0-9.]+)\ us$ ]] &&
  awk -v t="${BASH_REMATCH[1]}" 'BEGIN { exit !(t > 0) }'; then pass; else
  fail "bench --probe prints the round trip" "rc=$rc" "$out" "$err"
fi
run bench --probe --passes 2
if [ "$rc" -eq 2 ] && [[ $err == *"--probe takes only --threads"* ]]; then
  pass; else fail "bench --probe --passes refused" "rc=$rc" "$err"
fi
run bench
if [ "$rc" -eq 2 ] && [[ $err == *"one of --calibrate and --probe"* ]]; then
  pass; else fail "bench with nothing to do refused" "rc=$rc" "$err"
fi
run bench --calibrate --passes 10 --out "$T/cal10.json"
if [ "$rc" -eq 2 ] && [[ $err == *"--passes takes a count from 1 to 9, not '10'"* ]]; then
  pass; else fail "bench --passes 10 refused" "rc=$rc" "$err"
fi
# the profile's path a folder or a FIFO: refused before any pass is
# measured (each was found after them: the folder's rename failed, and
# the FIFO was replaced by a regular file holding the profile)
mkdir -p "$T/cal_folder"
expect_error "bench --calibrate --out a folder" \
  "^strata: error: --out $(re_quote "$T/cal_folder"): a folder, not a file: give a file's path$" \
  -- bench --calibrate --threads 1 --passes 1 --out "$T/cal_folder"
[[ $out != *calibrating* ]] && pass || fail "bench --out a folder measured first" "$out"
mkfifo "$T/cal_fifo"
STRATA_CALIBRATION="$T/cal_fifo" expect_error "bench --calibrate to a FIFO" \
  "^strata: error: STRATA_CALIBRATION $(re_quote "$T/cal_fifo"): not a regular file \(a device, FIFO or socket\), which the write would replace: give a file's path$" \
  -- bench --calibrate --threads 1 --passes 1
[ -p "$T/cal_fifo" ] && pass || fail "the FIFO STRATA_CALIBRATION names is still a FIFO"
# numbers as written: no blank, sign, hex or trailing comma slips through
# (strtol and strtod alone take them; $tiny: a slip runs seconds, not hours)
tiny="--set data.train_limit=64 --set data.test_limit=16 --set train.steps=2 --out $T/o_numbers"
while IFS='|' read -r want args; do
  read -r -a argv <<<"$args"
  argv=("${argv[@]//@/ }") # @: a blank inside one argument
  run "${argv[@]}"
  if [ "$rc" -eq 2 ] && [[ $err == *"$want"* ]]; then pass; else
    fail "refused: strata ${argv[*]}" "rc=$rc" "$err"
  fi
done <<NUMBERS
--seeds takes a whole number >= 1, not ' 3'|experiment pb configs/pb_mlp_fmnist.yaml $tiny --seeds @3
--depths takes rising stage counts >= 2 separated by commas (at most 16), not '4,+8'|experiment pb configs/pb_deep_mlp_fmnist.yaml $tiny --depths 4,+8
--depths takes rising stage counts >= 2 separated by commas (at most 16), not '4,8,'|experiment pb configs/pb_deep_mlp_fmnist.yaml $tiny --depths 4,8,
--lr-range takes MIN,MAX with 0 < MIN <= MAX, not '0x1p-3,1'|sweep configs/fc_mnist.yaml $tiny --trials 1 --target accuracy=0.8 --batch-sizes 8,16 --lr-range 0x1p-3,1
--batch-sizes takes increasing whole numbers >= 1, at most 32, as 1,2,4; not ' 8,16'|sweep configs/fc_mnist.yaml $tiny --trials 1 --target accuracy=0.8 --batch-sizes @8,16
--jobs takes a whole number from 1 to 65536, not '65537'|sweep configs/fc_mnist.yaml $tiny --target accuracy=0.8 --batch-sizes 8 --jobs 65537
--budget-steps takes a whole number from 1 to 2^40, not '1099511627777'|sweep configs/fc_mnist.yaml $tiny --target accuracy=0.8 --batch-sizes 8 --budget-steps 1099511627777
--stages takes a whole number from 1 to 1000000, not ' 2'|compile configs/fc_mnist.yaml --stages @2
--stages takes a whole number from 1 to 1000000, not '1000001'|compile configs/fc_mnist.yaml --stages 1000001
--ranks takes a whole number from 1 to 1000000, not '1000001'|compile configs/fc_mnist.yaml --ranks 1000001
--vocab must be an integer in [256, 1048576], not '+300'|tokenize train README.md --vocab +300 --out $T/plus.bpe
--threads takes a count from 1 to 4096, not ' 1'|bench --probe --threads @1
--fabric toaster: unknown fabric; one of cpu, cpu:N, mesh:WxH, wse2|compile configs/fc_mnist.yaml --fabric toaster --out $T/o_fabric
--fabric cpu:0: cpu:N takes a core count from 1 to 1048576|compile configs/fc_mnist.yaml --fabric cpu:0 --out $T/o_fabric
--fabric mesh:64: a mesh is mesh:WxH, e.g. mesh:64x64|compile configs/fc_mnist.yaml --fabric mesh:64 --out $T/o_fabric
--fabric mesh:2000000x2000000: too many PEs|compile configs/fc_mnist.yaml --fabric mesh:2000000x2000000 --out $T/o_fabric
NUMBERS
run bench --calibrate --out --threads 1
if [ "$rc" -eq 2 ] && [[ $err == *"--out needs a value before the option '--threads'"* ]] &&
  [ ! -e --threads ]; then
  pass; else fail "bench --out refuses an option as its FILE" "rc=$rc" "$err"
fi
run bench --probe --threads 0
if [ "$rc" -eq 2 ] && [[ $err == *"--threads takes a count from 1 to 4096, not '0'"* ]]; then
  pass; else fail "bench --threads 0 refused" "rc=$rc" "$err"
fi

run train "$run_dir/config.yaml" --set train.steps=1 --out "$T/run_again"
if [ "$rc" -eq 0 ]; then pass; else
  fail "resolved config.yaml loads again" "rc=$rc" "$err"
fi

checkpoint=$(find "$run_dir/checkpoints" -name 'step-*.safetensors' | sort | tail -n 1)
if [ -n "$checkpoint" ]; then pass; else
  fail "run wrote a checkpoint" "$(ls -la "$run_dir/checkpoints" 2>&1)"
fi
run inspect "$checkpoint"
if [ "$rc" -eq 0 ] &&
  grep -Eq '^ +blocks\.0\.linear0\.weight +F32 +256x784 ' "$T/stdout" &&
  grep -Eq '^ +optim\.blocks\.0\.linear0\.weight\.momentum +F32 +256x784 ' "$T/stdout"; then
  pass
else
  fail "inspect lists weights and optimizer state" "rc=$rc" "$out" "$err"
fi
# output that cannot be written (a full disk) fails the command, saying so
"$strata" inspect "$checkpoint" >/dev/full 2>"$T/full.err"
rc=$?
if [ "$rc" -eq 1 ] && [ "$(cat "$T/full.err")" = "strata: error: cannot write the standard output: No space left on device" ]; then
  pass
else
  fail "inspect to a full disk: exit 1 with one line" "rc=$rc" "$(cat "$T/full.err")"
fi
run eval "$fc" "${small[@]}" --checkpoint "$checkpoint"
if [ "$rc" -eq 0 ] && [[ $out =~ test\ accuracy\ [01]\.[0-9]+ ]] && [ -z "$err" ]; then pass; else
  fail "eval prints a test accuracy" "rc=$rc" "$out" "$err"
fi
# another training set than the weights': other pixel statistics, said
run eval "$fc" "${small[@]}" --set data.train_limit=256 --checkpoint "$checkpoint"
if [ "$rc" -eq 0 ] && grep -q "^strata: notice: .* was trained on 512 samples, this config selects 256 (data.train_limit, set by --set): the images are standardised with other statistics than in training" <<<"$err"; then pass; else
  fail "eval names a training set other than the checkpoint's" "rc=$rc" "$out" "$err"
fi
# as many samples as the weights saw, but other ones (another dataset):
# other statistics too, said by the training set's CRC-32
run eval "$fc" "${small[@]}" --set data.dataset=synthetic --checkpoint "$checkpoint"
if [ "$rc" -eq 0 ] && grep -q "^strata: notice: .* was trained on 512 samples of CRC-32 [0-9a-f]\{8\}, this config selects 512 of CRC-32 [0-9a-f]\{8\} (data.dataset, set by --set; data.dir, set at [^)]*): the images are standardised with other statistics than in training" <<<"$err"; then pass; else
  fail "eval names a training set of the same size but other samples" "rc=$rc" "$out" "$err"
fi
# raw pixels for weights trained on standardised ones (data.normalize,
# which the checkpoint records): said; a resume with it is refused
run eval "$fc" "${small[@]}" --set data.normalize=false --checkpoint "$checkpoint"
if [ "$rc" -eq 0 ] && [ "$err" = "strata: notice: $checkpoint was trained on standardised images, this config (data.normalize, set by --set) gives raw ones: the inputs are not those of training; evaluate with the run's config.yaml" ]; then pass; else
  fail "eval names a data.normalize other than the checkpoint's" "rc=$rc" "$out" "$err"
fi
cp -r "$run_dir" "$T/norm_run"
expect_error "resume with another data.normalize" \
  "^strata: error: .*: written with pixel standardisation 1, the config \(data.normalize\) gives 0: resuming would not continue the same run$" \
  -- train - --resume "$T/norm_run" --set data.normalize=false --set train.steps=30
# keys a resume changes and may change: said in one line, old and new
# values, and config.yaml holds the new ones (a second resume of it names
# only what it changes itself)
cp -r "$run_dir" "$T/changed_run"
run train - --resume "$T/changed_run" --set train.steps=25 --set optimizer.lr=0.1
if [ "$rc" -eq 0 ] && [ "$err" = "strata: notice: --resume: 2 keys differ from the run's $T/changed_run/config.yaml: optimizer.lr 0.05 -> 0.1, train.steps 20 -> 25; the run goes on with the new values, which $T/changed_run/config.yaml now holds" ] &&
   grep -q "^  lr: 0.1$" "$T/changed_run/config.yaml"; then pass; else
  fail "resume names the keys it changes" "rc=$rc" "$err"
fi
run train - --resume "$T/changed_run" --set train.steps=30
if [ "$rc" -eq 0 ] && [ "$err" = "strata: notice: --resume: 1 key differs from the run's $T/changed_run/config.yaml: train.steps 25 -> 30; the run goes on with the new value, which $T/changed_run/config.yaml now holds" ]; then pass; else
  fail "a second resume names only its own change" "rc=$rc" "$err"
fi

# a run's folder for a checkpoint: its newest (by step, not the first
# listed): step 19 a stub that could not load, step 20 the run's
mkdir -p "$T/two_ck/checkpoints"
printf 'stub' >"$T/two_ck/checkpoints/step-00000019.safetensors"
cp "$checkpoint" "$T/two_ck/checkpoints/step-00000020.safetensors"
run eval "$fc" "${small[@]}" --checkpoint "$checkpoint"
by_file=${out% (*}
run eval "$fc" "${small[@]}" --checkpoint "$T/two_ck"
if [ "$rc" -eq 0 ] && [ "$out" = "$by_file ($T/two_ck/checkpoints/step-00000020.safetensors)" ]; then pass; else
  fail "eval of a run's folder: its newest checkpoint" "rc=$rc" "want: $by_file ($T/two_ck/checkpoints/step-00000020.safetensors)" "$out" "$err"
fi
# CONFIG '-' with a run's folder: the run's own config.yaml (the same
# model, data and statistics: the same line, no notice)
run eval - --checkpoint "$run_dir"
if [ "$rc" -eq 0 ] && [ "$out" = "$by_file ($run_dir/checkpoints/${checkpoint##*/})" ] && [ -z "$err" ]; then pass; else
  fail "eval - with a run's folder: the run's config.yaml" "rc=$rc" "want: $by_file ($run_dir/checkpoints/${checkpoint##*/})" "$out" "$err"
fi
# the run's checkpoints/ folder itself: the run's
run eval - --checkpoint "$run_dir/checkpoints/"
if [ "$rc" -eq 0 ] && [ "$out" = "$by_file ($run_dir/checkpoints/${checkpoint##*/})" ] && [ -z "$err" ]; then pass; else
  fail "eval - with a run's checkpoints/ folder: the run's" "rc=$rc" "want: $by_file ($run_dir/checkpoints/${checkpoint##*/})" "$out" "$err"
fi
run inspect "$T/two_ck"
if [ "$rc" -eq 0 ] && grep -q "^$(re_quote "$T/two_ck/checkpoints/step-00000020.safetensors"): 12 tensors" <<<"$out"; then pass; else
  fail "inspect of a run's folder: its newest checkpoint" "rc=$rc" "$out" "$err"
fi
mkdir -p "$T/no_ck/checkpoints"
expect_error "eval of a run's folder with no checkpoint" \
  "^strata: error: $(re_quote "$T/no_ck"): a run's folder with no checkpoint in $(re_quote "$T/no_ck")/checkpoints yet$" \
  -- eval "$fc" "${small[@]}" --checkpoint "$T/no_ck"

# --- 7. truncated checkpoint --------------------------------------------------
half="$T/half.safetensors"
checkpoint=${checkpoint:-$T/missing.safetensors} # fails below, not here
checkpoint_size=$(stat -c %s "$checkpoint" 2>/dev/null || echo 0)
head -c $((checkpoint_size / 2)) "$checkpoint" >"$half" 2>/dev/null
expect_error "eval of a truncated checkpoint" \
  "$(re_quote "$half"): truncated" \
  -- eval "$fc" "${small[@]}" --checkpoint "$half"
expect_error "inspect of a truncated checkpoint" \
  "$(re_quote "$half"): truncated" -- inspect "$half"
head -c 4 "$checkpoint" >"$T/stub.safetensors"
expect_error "inspect of a 4-byte checkpoint" \
  "$(re_quote "$T/stub.safetensors"): truncated" -- inspect "$T/stub.safetensors"
expect_error "inspect of a missing file" \
  "$(re_quote "$T/none.safetensors"): cannot open" -- inspect "$T/none.safetensors"

cp -r "$run_dir" "$T/resume"
resume_checkpoint="$T/resume/checkpoints/${checkpoint##*/}"
cp "$half" "$resume_checkpoint"
expect_error "resume from a truncated checkpoint" \
  "$(re_quote "$resume_checkpoint"): truncated" \
  -- train - --resume "$T/resume" --set train.steps=30
no_tmp_left "resume from a truncated checkpoint" "$T/resume"
if cmp -s "$half" "$resume_checkpoint"; then pass; else
  fail "failed resume left the checkpoint as it was"
fi

# --- 8. a diverging run -------------------------------------------------------
# lr 1e10 blows the loss up within a few steps; checkpoint after every step so
# that the last good ones are on disk when the NaN arrives.
nan_dir="$T/nan"
expect_error "diverging run" \
  "step [0-9]+: .*(NaN|infinite)" \
  -- train "$fc" "${small[@]}" --set optimizer.lr=1e10 \
  --set train.checkpoint_every=1 --out "$nan_dir"
bad_step=$(sed -n 's/.*step \([0-9][0-9]*\):.*/\1/p' "$T/stderr" | head -n 1)
no_tmp_left "diverging run" "$nan_dir"
newest=-1
present=""
unreadable=""
for f in "$nan_dir"/checkpoints/*; do
  [ -e "$f" ] || continue
  present="$present ${f##*/}"
  step=$(printf '%s' "${f##*/}" | sed -n 's/^step-0*\([0-9][0-9]*\)\.safetensors$/\1/p')
  [ -n "$step" ] && [ "$step" -gt "$newest" ] && newest=$step
  "$strata" inspect "$f" >/dev/null 2>"$T/inspect_err" ||
    unreadable="$unreadable ${f##*/}: $(cat "$T/inspect_err")"
done
# Step numbers count completed steps, so step N failing leaves N-1 done.
if [ -n "$bad_step" ] && [ "$newest" -eq $((bad_step - 1)) ]; then pass; else
  fail "diverging run: checkpoints end just before the failing step" \
    "failing step '$bad_step', checkpoints present:${present:- none}"
fi
if [ -z "$unreadable" ]; then pass; else
  fail "diverging run: every checkpoint left loads" "$unreadable"
fi
valid_jsonl "diverging run metrics" "$nan_dir/metrics.jsonl"

# --- 10. data that does not fit the model ---------------------------------------
# Labels beyond model.classes and test images of another size would index out
# of bounds: both are refused before training starts.
expect_error "labels beyond model.classes" \
  "model\.classes: 5, but /usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte\.gz has labels up to 9" \
  -- train "$fc" "${small[@]}" --set model.classes=5 --out "$T/o_classes"
# one damaged label byte: the message says which sample holds it
FM=/usr/share/datasets/fashion-mnist
mkdir -p "$T/badlabel"
cp "$FM"/train-*.gz "$T/badlabel/"
gzip -dc "$FM/t10k-labels-idx1-ubyte.gz" >"$T/badlabel/t10k-labels-idx1-ubyte"
printf '\310' | dd of="$T/badlabel/t10k-labels-idx1-ubyte" bs=1 seek=$((8 + 100)) conv=notrunc 2>/dev/null
gzip "$T/badlabel/t10k-labels-idx1-ubyte"
cp "$FM/t10k-images-idx3-ubyte.gz" "$T/badlabel/"
expect_error "a damaged label names its sample" \
  "model\.classes: 10, but $(re_quote "$T/badlabel")/t10k-labels-idx1-ubyte\.gz has labels up to 200 \(the first past it: label 200 of sample 100\)" \
  -- train "$fc" "${small[@]}" --set data.dir="$T/badlabel" --out "$T/o_badlabel"
mkdir -p "$T/shapes"
python3 - "$T/shapes" <<'PY'
import gzip, struct, sys
d = sys.argv[1]
def write(name, magic, dims, payload):
    with gzip.open(f"{d}/{name}", "wb") as f:
        f.write(struct.pack(">" + "i" * (len(dims) + 1), magic, *dims) + payload)
write("train-images-idx3-ubyte.gz", 2051, (64, 28, 28), bytes(64 * 28 * 28))
write("train-labels-idx1-ubyte.gz", 2049, (64,), bytes(i % 10 for i in range(64)))
write("t10k-images-idx3-ubyte.gz", 2051, (16, 40, 40), bytes(16 * 40 * 40))
write("t10k-labels-idx1-ubyte.gz", 2049, (16,), bytes(i % 10 for i in range(16)))
PY
expect_error "test images of another size" \
  "error: $(re_quote "$T/shapes")/t10k-images-idx3-ubyte\.gz: test images are 1x40x40 but the training images \($(re_quote "$T/shapes")/train-images-idx3-ubyte\.gz\) are 1x28x28" \
  -- train "$fc" --set data.dir="$T/shapes" --set train.steps=1 \
  --set metrics.progress=off --out "$T/o_shapes"

# --- 11. resume refuses another run ---------------------------------------------
expect_error "resume under another seed" \
  "step-0*20\.safetensors: written with seed 42, the config \(train\.seed\) gives 7" \
  -- train "$fc" "${small[@]}" --set train.seed=7 --resume "$T/run"
# another count of samples: the keys that choose them are named
expect_error "resume on a training set of another size" \
  "step-0*20\.safetensors: written with training-set size [0-9]+, the config \(data\.dataset, data\.dir or data\.train_limit\) gives 1000" \
  -- train "$fc" "${small[@]}" --set data.train_limit=1000 --resume "$T/run"
# the same number of samples, one label changed: other data
mkdir -p "$T/relabeled"
cp "$FM"/*.gz "$T/relabeled/"
gzip -dc "$FM/train-labels-idx1-ubyte.gz" >"$T/relabeled/train-labels-idx1-ubyte"
printf '\011' | dd of="$T/relabeled/train-labels-idx1-ubyte" bs=1 seek=108 conv=notrunc 2>/dev/null
gzip -f "$T/relabeled/train-labels-idx1-ubyte"
expect_error "resume on other data of the same size" \
  "step-0*20\.safetensors: written on a training set of CRC-32 [0-9a-f]{8}, the config's \(data\.dataset or data\.dir\) has [0-9a-f]{8}: the same size, other data" \
  -- train "$fc" "${small[@]}" --set data.dir="$T/relabeled" --resume "$T/run"
stored=(--set execution.mode=weight_streaming --set execution.store=file)
run train "$fc" "${small[@]}" "${stored[@]}" --out "$T/run_store"
expect_error "resume of a file store on other data of the same size" \
  "store\.strata: written on a training set of CRC-32 [0-9a-f]{8}, the config's \(data\.dataset or data\.dir\) has [0-9a-f]{8}" \
  -- train "$fc" "${small[@]}" "${stored[@]}" --set data.dir="$T/relabeled" --resume "$T/run_store"
expect_error "resume from a missing run" \
  "^strata: error: $(re_quote "$T/nope")/config.yaml: cannot open: no run to resume$" \
  -- train "$fc" "${small[@]}" --resume "$T/nope"
if [ ! -e "$T/nope" ]; then pass; else
  fail "a mistyped --resume creates nothing" "$T/nope exists"
fi

# --- 12. compile ------------------------------------------------------------------
run compile --help
if [ "$rc" -eq 0 ] && printf '%s' "$out" | grep -q -- "--fabric"; then pass; else
  fail "compile --help" "rc $rc" "$out"
fi
run compile "$fc" --validate-only
if [ "$rc" -eq 0 ] && printf '%s' "$out" | grep -q "269,322\|269322"; then pass; else
  fail "compile --validate-only names the parameter count" "rc $rc" "$out" "$err"
fi
run compile "$fc" --fabric cpu:4 --out "$T/plan"
if [ "$rc" -eq 0 ] && [ -s "$T/plan/plan.json" ] && [ -s "$T/plan/plan.svg" ] &&
   python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$T/plan/plan.json"; then
  pass
else
  fail "compile writes plan.json and plan.svg" "rc $rc" "$err"
fi
[ ! -e "$T/o_fabric" ] && pass || fail "a refused --fabric wrote $T/o_fabric"
expect_error "compile: more stages than blocks" "--stages 9: more stages than the model's 3 blocks" \
  -- compile "$fc" --fabric cpu:8 --stages 9 --out "$T/o_stages"
# the noise scale in a mode that train refuses it in: compile refuses it
# too, up front, naming the key; on a mesh a sequential config's plan is
# then weight streaming, which measures it, not a pipeline, which does not
for m in pipeline block_sequential; do
  expect_error "compile: the noise scale in the $m mode" \
    "^strata: error: --set: metrics\.noise_scale: is not available in the $m mode yet" \
    -- compile "$fc" --set execution.mode=$m --set metrics.noise_scale=true --out "$T/o_noise"
  expect_error "train: the noise scale in the $m mode" \
    "^strata: error: --set: metrics\.noise_scale: is not available in the $m mode yet" \
    -- train "$fc" "${small[@]}" --set execution.mode=$m --set metrics.noise_scale=true --out "$T/o_noise"
done
run compile "$fc" --fabric wse2 --set metrics.noise_scale=true --out "$T/o_noise_wse2"
if [ "$rc" -eq 0 ] && grep -q "^mode: weight streaming" <<<"$out"; then pass; else
  fail "compile --fabric wse2 with the noise scale plans weight streaming" "rc $rc" "$out" "$err"
fi
# --ranks N: which stages each rank holds and its memory by the plan (a
# stage per rank with placement: ranks; the weights at the store rank of
# weight streaming), in the text and in plan.json; a rank over
# execution.rank_memory_limit is named, with the shortfall
wide4=(--set model.hidden=[1024,1024,1024] --set execution.mode=pipeline --set execution.stages=2
       --set execution.placement=ranks --fabric cpu:2)
run compile "$fc" "${wide4[@]}" --ranks 2 --out "$T/o_ranks"
if [ "$rc" -eq 0 ] && grep -Eq "^rank 0: stage 0, [0-9.]+ MB by the plan's memory$" <<<"$out" &&
   grep -Eq "^rank 1: stage 1, [0-9.]+ MB by the plan's memory$" <<<"$out" &&
   grep -Eq '"ranks": \[\{"rank": 0, "stages": \[0, 1\], "memory": [0-9.e+]+\}, \{"rank": 1, "stages": \[1, 2\], "memory": [0-9.e+]+\}\]' "$T/o_ranks/plan.json"; then
  pass
else
  fail "compile --ranks 2: each rank's stage and memory" "rc $rc" "$out" "$err"
fi
# as train: execution.stages 0 over ranks is a stage a rank; fewer stages
# than ranks is refused, not shown with a rank holding nothing
run compile "$fc" "${wide4[@]}" --set execution.stages=0 --ranks 2 --out "$T/o_ranks0"
if [ "$rc" -eq 0 ] && grep -Eq "^rank 1: stage 1, [0-9.]+ MB by the plan's memory$" <<<"$out"; then
  pass; else fail "compile --ranks 2, execution.stages 0: a stage a rank" "rc $rc" "$out" "$err"
fi
expect_error "compile --ranks 2 with one stage" \
  "--set: execution.stages: 1 stage over 2 ranks \(execution.placement: ranks\): each rank needs a stage" \
  -- compile "$fc" "${wide4[@]}" --set execution.stages=1 --ranks 2 --out "$T/o_ranks1"
run compile "$fc" --set model.hidden=[1024,1024,1024] --set execution.mode=weight_streaming --fabric cpu:2 \
  --ranks 3 --out "$T/o_ranks_ws"
if [ "$rc" -eq 0 ] && grep -Eq "^rank 0: the weight store, [0-9.]+ MB by the plan's memory$" <<<"$out" &&
   grep -Eq "^rank 2: a compute rank, [0-9.]+ MB by the plan's memory$" <<<"$out"; then
  pass
else
  fail "compile --ranks 3, weight streaming: the store and the compute ranks" "rc $rc" "$out" "$err"
fi
expect_error "compile --ranks 2: a rank over execution.rank_memory_limit" \
  "--set: execution.rank_memory_limit is 10 MB, but the plan gives rank [01] of 2 [0-9.]+ MB \(its stages' weights, state and activations, the data 55 MB and the trainer's batch buffers [0-9.]+ [KM]B\): short by [0-9.]+ MB; its largest block, blocks.[0-9], holds [0-9.]+ MB of weights" \
  -- compile "$fc" "${wide4[@]}" --ranks 2 --set execution.rank_memory_limit=10000000 --out "$T/o_lim"
# replicas over ranks hold their memory as the run does: a 2 x 2 grid (2
# replicas of a 2-stage pipeline) on a cpu:4 of 17.6 MB needs 19.5 MB in
# one process, but at most 15.1 MB on a rank (13.7 MB of stages, the data
# every rank loads, 768 images, and the trainer's batch buffers): it fits
# over 4 machines, is refused with the 4 ranks on one machine (a quarter
# each), naming the machine's memory and the rank
grid=(--set model.hidden=[512,512,512,512] --set train.batch=32 --set execution.mode=pipeline
      --set execution.stages=2 --set execution.micro_batch=4 --set execution.replicas=2
      --set execution.placement=ranks --set fabric.cores=4 --set fabric.pe_memory=4400000
      --set data.train_limit=512 --set data.test_limit=256)
run compile "$fc" "${grid[@]}" --ranks 4 --out "$T/o_grid"
if [ "$rc" -eq 0 ] && grep -q "^mode: pipeline (1f1b): it fits cpu:4 over 4 ranks (each rank's share below)$" <<<"$out" &&
   grep -q "^each rank may hold 17.6 MB (its machine's memory, one rank a machine)$" <<<"$out" &&
   grep -q '"rank_allowed": 17600000, "rank_per_machine": 1,' "$T/o_grid/plan.json"; then
  pass
else
  fail "compile --ranks 4: replicas over ranks, each rank against its machine" "rc $rc" "$out" "$err"
fi
expect_error "compile: replicas in one process do not fit" \
  "2 replicas do not fit cpu:4: .* they need 19.5 MB, the machine holds 17.6 MB: short by" \
  -- compile "$fc" "${grid[@]}" --mode pipeline --out "$T/o_grid1"
expect_error "compile --ranks-per-machine 4: a rank over its share of the machine" \
  "the memory its machine gives a rank is 4.4 MB \(cpu:4: 17.6 MB of memory, over the 4 ranks on it\), but the plan gives rank 0 of 4 15.1 MB \(its stages' weights, state and activations, the data 603 KB and the trainer's batch buffers 828 KB\): short by 10.7 MB; its largest block, blocks.0, holds 1.61 MB of weights" \
  -- compile "$fc" "${grid[@]}" --mode pipeline --ranks 4 --ranks-per-machine 4 --out "$T/o_grid4"
run compile "$fc" --ranks-per-machine 2 --out "$T/o_grid_usage"
if [ "$rc" -eq 2 ] && grep -q -- "--ranks-per-machine takes a whole number from 1 to --ranks N, not '2'" <<<"$err"; then pass; else
  fail "compile --ranks-per-machine without --ranks: usage error" "rc $rc" "$out" "$err"
fi
# without --stages, a pipelined config's execution.stages is the plan's K
printf 'model:\n  hidden: [64, 64]\nexecution:\n  mode: pipelined_backprop\n  stages: 3\noptimizer:\n  nesterov: false\n' >"$T/pb3.yaml"
run compile "$T/pb3.yaml" --fabric cpu:4 --out "$T/o_pb3"
if [ "$rc" -eq 0 ] && printf '%s' "$out" | grep -q "in 3 stages" &&
   printf '%s' "$out" | grep -q "as asked (execution.stages 3)"; then pass; else
  fail "compile takes the config's execution.stages" "rc $rc" "$out" "$err"
fi
expect_error "compile: the config's stages exceed the cores" \
  "pb3.yaml:5:11: execution.stages 3: more stages than the 2 cores of cpu:2" \
  -- compile "$T/pb3.yaml" --fabric cpu:2 --out "$T/o_pb3b"
# The published GPT shapes (docs/models.md): sized from descriptors alone,
# strata's exact parameter count (tests/compile/test_gpt_configs.c).
for gpt in gpt2_124m:124,439,808 gpt3_xl_1.3b:1,315,723,264 \
  gptj_6b:6,051,520,512 gpt3_13b:12,952,938,780 gpt_neox_20b:20,554,567,680; do
  run compile "configs/${gpt%%:*}.yaml" --validate-only
  if [ "$rc" -eq 0 ] && printf '%s\n' "$out" | grep -q "^parameters: ${gpt#*:} "; then
    pass
  else
    fail "compile --validate-only ${gpt%%:*}: parameters ${gpt#*:}" "rc $rc" "$out" "$err"
  fi
done
# at its published batch the 20B model does not fit the wafer layer-
# pipelined: compile chooses weight streaming and says why; a mesh too small
# for any mode is refused, each mode's shortfall and the smallest mesh named
run compile configs/gpt_neox_20b.yaml --fabric wse2 --out "$T/o_neox"
if [ "$rc" -eq 0 ] && grep -q '^mode: weight streaming (recomputing each block): it fits wse2 .*not before it: pipeline (1f1b): .*does not fit wse2' <<<"$out" &&
  grep -q '"mode": "weight_streaming"' "$T/o_neox/plan.json"; then pass; else
  fail "compile: gpt_neox_20b on wse2 by weight streaming, chosen by memory" "rc $rc" "$out" "$err"
fi
expect_error "compile: gpt_neox_20b fits no mode of a small mesh" \
  "no mode fits mesh:300x300 \(the smallest square mesh of these PEs that would hold it is mesh:[0-9]+x[0-9]+ .*\): pipeline \(1f1b\): .*short by .*weight streaming \(recomputing each block\): .*micro-batches of 1 need " \
  -- compile configs/gpt_neox_20b.yaml --fabric mesh:300x300 --out "$T/o_neox2"
# --mode forces one and says what it costs against the chosen
run compile configs/fc_mnist.yaml --fabric wse2 --mode weight_streaming --out "$T/o_force"
if [ "$rc" -eq 0 ] && grep -q '^mode: forced (--mode weight_streaming, keeping activations): predicted .* samples/s, 0\.[0-9]*x the .* samples/s of pipeline (1f1b), the plan compile chooses' <<<"$out"; then pass; else
  fail "compile --mode weight_streaming: what forcing costs" "rc $rc" "$out" "$err"
fi
run compile configs/fc_mnist.yaml --mode layered --out "$T/o_force2"
if [ "$rc" -eq 2 ] && grep -q -- "--mode takes auto" <<<"$err"; then pass; else
  fail "compile --mode with an unknown mode: usage error" "rc $rc" "$out" "$err"
fi

# --- 13. tokenize -------------------------------------------------------------------
python3 -c 'import random; r = random.Random(5); w = ["the", "cat", "sat", "on", "a", "mat", "and", "then", "slept"]; print(" ".join(r.choice(w) for _ in range(4000)))' >"$T/corpus.txt"
run tokenize train "$T/corpus.txt" --vocab 300 --out "$T/tok.bpe"
if [ "$rc" -eq 0 ] && head -n 1 "$T/tok.bpe" | grep -q "^strata-bpe 1$"; then pass; else
  fail "tokenize train writes a tokenizer" "rc $rc" "$out" "$err"
fi
cp "$T/corpus.txt" "$T/corpus2.txt"
expect_error "tokenize train --out the corpus" \
  "^strata: error: --out $(re_quote "$T/corpus2.txt") is the corpus $(re_quote "$T/corpus2.txt"): the tokenizer would be written over it; give another --out$" \
  -- tokenize train "$T/corpus2.txt" --vocab 300 --out "$T/corpus2.txt"
if cmp -s "$T/corpus.txt" "$T/corpus2.txt"; then pass; else fail "the corpus as it was"; fi
# an output file's path naming a folder, refused before any work (each
# failed at its end with "rename failed: Is a directory"): tokenize's
# --out, train's --trace (no run folder left), export's --out
mkdir -p "$T/a_folder"
expect_error "tokenize train --out a folder" \
  "^strata: error: --out $(re_quote "$T/a_folder"): a folder, not a file: give a file's path$" \
  -- tokenize train "$T/corpus.txt" --vocab 300 --out "$T/a_folder"
expect_error "train --trace a folder" \
  "^strata: error: --trace $(re_quote "$T/a_folder"): a folder, not a file: give a file's path$" \
  -- train "$fc" --set data.train_limit=512 --set data.test_limit=64 --set train.steps=3 \
  --set metrics.progress=off --trace "$T/a_folder" --out "$T/o_trace_folder"
if [ ! -e "$T/o_trace_folder" ]; then pass; else fail "a refused --trace leaves no run folder"; fi
# a path that is no regular file: the write's rename would replace it (as
# root, --out /dev/full made /dev/full a regular file holding the tokenizer)
mkfifo "$T/a_fifo"
expect_error "tokenize train --out a FIFO" \
  "^strata: error: --out $(re_quote "$T/a_fifo"): not a regular file \(a device, FIFO or socket\), which the write would replace: give a file's path$" \
  -- tokenize train "$T/corpus.txt" --vocab 300 --out "$T/a_fifo"
if [ -p "$T/a_fifo" ]; then pass; else fail "the FIFO --out named is still a FIFO"; fi
# an empty path: refused before training (it trained, then ended in
# ": rename failed: No such file or directory", naming no option)
expect_error "tokenize train --out ''" \
  "^strata: error: --out: an empty path: give a file's path$" \
  -- tokenize train "$T/corpus.txt" --vocab 300 --out ""
expect_error "bench --calibrate --out ''" \
  "^strata: error: --out: an empty path: give a file's path$" \
  -- bench --calibrate --threads 1 --passes 1 --out ""
run tokenize encode "$T/corpus.txt" --tokenizer "$T/tok.bpe"
ids=$(printf '%s' "$out" | wc -w)
bytes=$(wc -c <"$T/corpus.txt")
if [ "$rc" -eq 0 ] && [ "$ids" -gt 0 ] && [ "$ids" -lt $((bytes / 2)) ]; then pass; else
  fail "tokenize encode compresses the corpus" "rc $rc, $ids ids for $bytes bytes" "$err"
fi
# a FILE past what BPE encodes at once (2^31 bytes, sparse): refused by
# its size, naming it (it was read whole, then 'encode: text of 2147483648
# bytes is too long' named no file)
truncate -s 2147483648 "$T/big.txt"
expect_error "tokenize encode: a 2 GiB FILE under BPE" \
  "^strata: error: $(re_quote "$T/big.txt"): 2147483648 bytes; a BPE tokenizer encodes at most 2147483646 bytes at once \(split the file\)$" \
  -- tokenize encode "$T/big.txt" --tokenizer "$T/tok.bpe"
rm -f "$T/big.txt"
printf 'not a tokenizer\n' >"$T/bad.bpe"
expect_error "tokenize: not a tokenizer file" "$(re_quote "$T/bad.bpe")" \
  -- tokenize encode "$T/corpus.txt" --tokenizer "$T/bad.bpe"

# --- 14. sweep ------------------------------------------------------------------------
run sweep "$fc" --batch-sizes 8,16 --target accuracy=0.9 --trials 2 \
  --budget-steps 40 --eval-every 5 --out "$T/sweep" \
  --set data.dataset=synthetic --set data.train_limit=512 \
  --set data.test_limit=128 --set model.hidden=[16] --set metrics.progress=off \
  --set execution.stages=2
if [ "$rc" -eq 0 ] && [ -s "$T/sweep/sweep.csv" ] && [ -s "$T/sweep/steps.csv" ] &&
   [ -s "$T/sweep/steps.svg" ] && [ -s "$T/sweep/report.md" ] &&
   [ "$(wc -l <"$T/sweep/steps.csv")" -eq 3 ]; then
  pass
else
  fail "sweep writes its four files, one steps row per batch size" "rc $rc" "$err"
fi
# The trials train the config's mode (sequential): a pipeline's key is
# dead there, and the sweep says so as `strata train` does.
if grep -q "notice: --set: execution.stages is not used by execution.mode sequential; ignored" <<<"$err"; then
  pass
else
  fail "sweep: a key the trials' mode never reads gets the notice" "$err"
fi
# A malformed --target is command-line misuse: exit 2, the cause first.
run sweep "$fc" --batch-sizes 8 --target speed=9 --out "$T/o_sweep"
if [ "$rc" -eq 2 ] && printf '%s\n' "$err" | head -n 1 |
   grep -q "target 'speed=9': unknown metric 'speed' (accuracy, test_accuracy, loss or test_loss)"; then
  pass
else
  fail "sweep: bad target is a usage error naming the metric" "rc $rc" "$err"
fi

# Per-batch budgets, a geometric evaluation schedule and the noise run.
run sweep "$fc" --batch-sizes 8,16 --target accuracy=0.9 --trials 2 \
  --budget-steps 40 --budget-epochs 1 --eval-every 2 --eval-growth 1.5 \
  --noise-batch 16 --out "$T/sweep2" \
  --set data.dataset=synthetic --set data.train_limit=512 \
  --set data.test_limit=128 --set model.hidden=[16] --set metrics.progress=off
if [ "$rc" -eq 0 ] && grep -q "^## Critical batch size" "$T/sweep2/report.md" &&
   grep -q "^| 16 |.* 32 |$" "$T/sweep2/report.md" &&
   { [ -s "$T/sweep2/noise.csv" ] || grep -q "not measured" "$T/sweep2/report.md"; } &&
   # the closing line names noise.csv where it was written (it never did)
   { [[ $out == *"steps.svg, noise.csv and report.md"* ]] || [ ! -e "$T/sweep2/noise.csv" ]; }; then
  pass
else
  fail "sweep --budget-epochs --eval-growth --noise-batch" "rc $rc" "$err" \
    "$(cat "$T/sweep2/report.md" 2>/dev/null)"
fi
run sweep "$fc" --batch-sizes 8,,16 --target accuracy=0.9 --out "$T/o_sweep"
if [ "$rc" -eq 2 ] && head -n 1 <<<"$err" | grep -q "batch-sizes takes increasing whole numbers >= 1, at most 32, as 1,2,4; not '8,,16'"; then
  pass
else
  fail "sweep: an empty entry in --batch-sizes is a usage error" "rc $rc" "$err"
fi
run sweep "$fc" --batch-sizes 8 --target accuracy=0.9 --eval-growth 0.5 --out "$T/o_sweep"
if [ "$rc" -eq 2 ] && head -n 1 <<<"$err" |
   grep -q "eval-growth takes a number >= 1, not '0.5'"; then pass; else
  fail "sweep: --eval-growth below 1 is a usage error" "rc $rc" "$err"
fi
expect_error "sweep: noise batch not swept" "noise batch 12 must be one of the batch sizes" \
  -- sweep "$fc" --batch-sizes 8,16 --target accuracy=0.9 --noise-batch 12 \
  --out "$T/o_sweep" --set data.dataset=synthetic

# --- 15. experiment -----------------------------------------------------------------
# A missing or unknown kind, a missing CONFIG and a bad count are command-line
# misuse: exit 2, the cause first, then the usage.
run experiment
if [ "$rc" -eq 2 ] && [ "$(head -n 1 <<<"$err")" = "strata: error: experiment needs a kind: pb" ] &&
   grep -q "^usage: strata experiment pb CONFIG" <<<"$err"; then pass; else
  fail "experiment without a kind exits 2 with the usage" "rc $rc" "$err"
fi
run experiment pb
if [ "$rc" -eq 2 ] && [ "$(head -n 1 <<<"$err")" = "strata: error: experiment pb needs a CONFIG" ] &&
   grep -q "^usage: strata experiment pb CONFIG" <<<"$err"; then pass; else
  fail "experiment pb without CONFIG exits 2 with the usage" "rc $rc" "$err"
fi
run experiment bogus "$fc"
if [ "$rc" -eq 2 ] && [ "$(head -n 1 <<<"$err")" = "strata: error: unknown experiment 'bogus' (pb)" ]; then pass; else
  fail "unknown experiment exits 2" "rc $rc" "$err"
fi
run experiment pb "$fc" --seeds 0 --out "$T/o_exp"
if [ "$rc" -eq 2 ] && [ "$(head -n 1 <<<"$err")" = "strata: error: --seeds takes a whole number >= 1, not '0'" ]; then pass; else
  fail "experiment: a bad --seeds is a usage error" "rc $rc" "$err"
fi
for bad in 4,2 1,4 4,,8 4x; do
  run experiment pb "$fc" --depths "$bad" --out "$T/o_exp"
  if [ "$rc" -eq 2 ] && [ "$(head -n 1 <<<"$err")" = "strata: error: --depths takes rising stage counts >= 2 separated by commas (at most 16), not '$bad'" ]; then pass; else
    fail "experiment: --depths $bad is a usage error" "rc $rc" "$err"
  fi
done
run experiment --help
if [ "$rc" -eq 0 ] && [[ $out == *"usage: strata experiment pb"* ]]; then pass; else
  fail "strata experiment --help" "rc $rc" "$out$err"
fi
exp_args=(--set data.dataset=synthetic --set data.train_limit=64 --set data.test_limit=64
  --set model.hidden=[8,8] --set train.steps=6 --set train.batch=4)
run experiment pb "$fc" --seeds 1 --points 3 --jobs 2 --out "$T/exp" "${exp_args[@]}"
if [ "$rc" -eq 0 ] && [ "$(grep -c '^strata: experiment: \[[0-9]/7\] ' <<<"$out")" -eq 7 ] &&
   [ "$(wc -l <"$T/exp/results.csv")" -eq 8 ] && [ -s "$T/exp/results.md" ] &&
   head -c 4 "$T/exp/curves.svg" | grep -q '<svg'; then
  pass
else
  fail "experiment pb: a line per run, results.csv, results.md, curves.svg" "rc $rc" "$out" "$err"
fi
expect_error "experiment pb refuses adamw, naming the variant" \
  "^strata: error: experiment pb: variant none, seed 42: --set: optimizer\.kind: adamw" \
  -- experiment pb "$fc" "${exp_args[@]}" --set optimizer.kind=adamw --out "$T/o_exp_adamw"

# --- 8b. gpt: train, generate, and their bad inputs ---------------------------
# A one-layer GPT on a small generated corpus, then sampling from it.
for i in $(seq 1 400); do echo "line $i: the quick brown fox jumps over the lazy dog $((i * 7 % 13))"; done >"$T/corpus.txt"
gpt=(--set model.kind=gpt --set data.dataset=text --set data.path="$T/corpus.txt"
     --set model.context=16 --set model.layers=1 --set model.heads=2
     --set model.width=16 --set train.batch=4 --set train.steps=5
     --set optimizer.kind=adamw --set optimizer.lr=0.01
     --set optimizer.nesterov=false) # fc_mnist's, which adamw does not read
run train "$fc" "${gpt[@]}" --out "$T/gpt"
gck="$T/gpt/checkpoints/step-00000005.safetensors"
if [ "$rc" -eq 0 ] && [ -s "$gck" ] &&
   printf '%s\n' "$out" | grep -q "validation loss .* next-token accuracy"; then
  pass
else
  fail "gpt trains on a text corpus and reports its validation loss" "rc $rc" "$out" "$err"
fi
# At context 1 (one label a sample, as a classifier's) it is still a language
# model: a validation loss in bits per token, and a vocabulary, not classes.
run train "$fc" "${gpt[@]}" --set model.context=1 --out "$T/gpt_c1"
if [ "$rc" -eq 0 ] &&
   printf '%s\n' "$out" | grep -q "validation loss .* bits per token), next-token accuracy" &&
   printf '%s\n' "$out" | grep -q "a sample is one sequence"; then
  pass
else
  fail "a gpt at context 1 reports its validation loss" "rc $rc" "$out" "$err"
fi
run compile "$fc" "${gpt[@]}" --set model.context=1 --validate-only
if [ "$rc" -eq 0 ] && printf '%s\n' "$out" | grep -q "^model: gpt, 3 blocks, 1 tokens per sequence, vocabulary"; then
  pass
else
  fail "compile --validate-only sizes a gpt at context 1 as a language model" "rc $rc" "$out" "$err"
fi
# pipelined backprop with a tied head and embedding in different stages:
# compile refuses the plan as the run refuses it (it planned 2 stages the
# run would not start); untied, or in one stage, it plans
pbt=(--set execution.mode=pipelined_backprop --set execution.mitigation=stash)
for how in "train" "compile"; do
  more=(--out "$T/gpt_pb_tied_$how")
  [ "$how" = compile ] && more+=(--stages 2) || more+=(--set execution.stages=2)
  expect_error "$how: pipelined backprop splits a tied gpt" \
    "^strata: error: default: model.tied: the head and the token embedding share weights but land in different stages, which update at different delays in pipelined_backprop; set model.tied: false$" \
    -- "$how" "$fc" "${gpt[@]}" "${pbt[@]}" "${more[@]}"
done
# --mode pipelined_backprop under the config's own rules, as train checks
# them (it planned sc+lwp under AdamW, Nesterov's momentum, both refused)
expect_error "compile --mode pipelined_backprop of an AdamW config" \
  "^strata: error: default: execution.mitigation: sc\+lwp is defined for momentum SGD \(BACKGROUND.md 2\); with optimizer.kind adamw \(set by --set\) use none or stash$" \
  -- compile configs/gpt_tiny.yaml --set model.tied=false --set optimizer.kind=adamw \
  --mode pipelined_backprop --out "$T/pb_adamw"
expect_error "compile --mode pipelined_backprop of a Nesterov config" \
  "^strata: error: .*optimizer.nesterov: pipelined_backprop updates with heavy-ball momentum" \
  -- compile "$fc" --mode pipelined_backprop --out "$T/pb_nesterov"
run compile "$fc" "${gpt[@]}" "${pbt[@]}" --set model.tied=false --stages 2 --out "$T/gpt_pb_untied"
rc_untied=$rc
run compile "$fc" "${gpt[@]}" "${pbt[@]}" --stages 1 --out "$T/gpt_pb_one"
if [ "$rc_untied" -eq 0 ] && [ "$rc" -eq 0 ]; then pass; else
  fail "compile: pipelined backprop plans an untied gpt, or a tied one in one stage" "rc $rc_untied/$rc" "$err"
fi
# The HF GPT-2 names; the tied head is stored once, as transformer.wte.
run inspect "$gck"
if [ "$rc" -eq 0 ] && printf '%s\n' "$out" | grep -q "transformer.h.0.attn.c_attn.weight  *F32  *16x48" &&
   ! printf '%s\n' "$out" | grep -q "lm_head"; then
  pass
else
  fail "gpt checkpoint uses HF GPT-2 names, tied head stored once" "$out"
fi
# --against a sharded run's folder (its newest checkpoint is a folder of
# shards): said as such, not "not a regular file"
run train "$fc" "${gpt[@]}" --set train.checkpoint_format=shards --out "$T/gpt_shards"
expect_error "inspect --against a sharded checkpoint" \
  "^strata: error: $(re_quote "$T/gpt_shards")/checkpoints/step-00000005: a sharded checkpoint's folder: --against compares two files \(\`strata export\` of its run merges its shards into one\)$" \
  -- inspect "$gck" --against "$T/gpt_shards"
run generate "$fc" "${gpt[@]}" --checkpoint "$gck" --prompt "line 7" --tokens 20 --seed 3
first=$out
run generate "$fc" "${gpt[@]}" --checkpoint "$gck" --prompt "line 7" --tokens 20 --seed 3
if [ "$rc" -eq 0 ] && [ "$out" = "$first" ] && [[ $out == "line 7"* ]] &&
   [ "${#out}" -ge 26 ]; then
  pass
else
  fail "generate: prompt then 20 tokens, same seed same text" "rc $rc" "$first" "$out" "$err"
fi
run generate "$fc" "${gpt[@]}" --checkpoint "$T/gpt" --prompt "line 7" --tokens 20 --seed 3
if [ "$rc" -eq 0 ] && [ "$out" = "$first" ]; then pass; else
  fail "generate from the run's folder: its newest checkpoint's text" "rc $rc" "$first" "$out" "$err"
fi
# The training set's CRC-32 covers exactly the tokens its windows read: 8
# windows of 16 from 0 read bytes 0-128 (byte tokens). Byte 128 changed is
# other data; byte 129, past every window, is not.
run train "$fc" "${gpt[@]}" --set data.train_limit=8 --set train.steps=2 --out "$T/gpt_crc"
for at in 128 129; do
  python3 -c 'import sys; b = bytearray(open(sys.argv[1], "rb").read()); b[int(sys.argv[2])] ^= 1; open(sys.argv[3], "wb").write(b)' \
    "$T/corpus.txt" "$at" "$T/corpus_$at.txt"
  run train - --resume "$T/gpt_crc" --set data.path="$T/corpus_$at.txt" --set train.steps=3
  if [ "$at" -eq 128 ] && [ "$rc" -eq 1 ] && grep -q "written on a training set of CRC-32" <<<"$err"; then pass
  elif [ "$at" -eq 129 ] && [ "$rc" -eq 0 ]; then pass
  else fail "resume on the corpus with byte $at changed" "rc $rc" "$err"; fi
  rm -rf "$T/gpt_crc/checkpoints/step-00000003.safetensors"
done
# A BPE tokenizer strata trained itself: the model takes its vocabulary.
run tokenize train "$T/corpus.txt" --vocab 300 --out "$T/bpe.txt"
run train "$fc" "${gpt[@]}" --set data.tokenizer="$T/bpe.txt" --out "$T/gpt_bpe"
bck="$T/gpt_bpe/checkpoints/step-00000005.safetensors"
run inspect "$bck"
if [ "$rc" -eq 0 ] && printf '%s\n' "$out" | grep -q "transformer.wte.weight  *F32  *300x16"; then
  pass
else
  fail "gpt trains with a BPE tokenizer of vocabulary 300" "rc $rc" "$out" "$err"
fi
run generate "$fc" "${gpt[@]}" --set data.tokenizer="$T/bpe.txt" --checkpoint "$bck" --prompt "line 7" --tokens 5
if [ "$rc" -eq 0 ] && [[ $out == "line 7"* ]]; then pass; else
  fail "generate decodes BPE tokens" "rc $rc" "$out" "$err"
fi
# another tokenizer of the same vocabulary: its ids name other text, so
# generate and eval refuse the checkpoint, naming both CRC-32s
cat README.md >>"$T/corpus2.txt"
run tokenize train "$T/corpus2.txt" --vocab 300 --out "$T/bpe_other.txt"
for cmd in generate eval; do
  more=()
  [ "$cmd" = generate ] && more=(--prompt "line 7" --tokens 5)
  expect_error "$cmd with another tokenizer of the same vocabulary" \
    "^strata: error: $(re_quote "$bck"): trained with another tokenizer \(CRC-32 [0-9a-f]{8}\), the config's data.tokenizer \($(re_quote "$T/bpe_other.txt"), set by --set\) has [0-9a-f]{8}: its token ids would name other text$" \
    -- "$cmd" "$fc" "${gpt[@]}" --set data.tokenizer="$T/bpe_other.txt" --checkpoint "$bck" "${more[@]}"
done
# a resume under another tokenizer is refused as eval and generate refuse
# it, naming both CRC-32s: before, its embedding of another vocabulary was
# refused first as a tensor of the wrong shape, as if the file were bad
cp -r "$T/gpt_bpe" "$T/gpt_bpe_resume"
expect_error "resume with another tokenizer" \
  "^strata: error: $(re_quote "$T/gpt_bpe_resume/checkpoints/step-00000005.safetensors"): trained with another tokenizer \(CRC-32 [0-9a-f]{8}\), the config's data.tokenizer \(bytes, set by --set\) has [0-9a-f]{8}: its token ids would name other text$" \
  -- train - --resume "$T/gpt_bpe_resume" --set data.tokenizer=bytes --set train.steps=6
expect_error "generate: prompt longer than the context" \
  "the prompt is 17 tokens, longer than the context of 16 \(model.context, --set\)" \
  -- generate "$fc" "${gpt[@]}" --checkpoint "$gck" --prompt "0123456789abcdefg"
expect_error "generate: checkpoint of another shape" \
  "$(re_quote "$gck"): tensor 'transformer.wte.weight' is F32 256x16, the model needs F32 256x32" \
  -- generate "$fc" "${gpt[@]}" --set model.width=32 --checkpoint "$gck" --prompt "x"
expect_error "generate: empty prompt" "the prompt is empty" \
  -- generate "$fc" "${gpt[@]}" --checkpoint "$gck" --prompt ""
expect_error "synthetic data past 256 classes names the key" \
  "^strata: error: --set: model.classes: 300, but data.dataset synthetic makes at most 256 classes$" \
  -- train "$fc" --set data.dataset=synthetic --set model.classes=300 --out "$T/syn300"
expect_error "a tokenizer file that is not there names its key" \
  "^strata: error: --set: data.tokenizer: byt: cannot open: No such file or directory \(the key is \"bytes\" or a file from strata tokenize train\)$" \
  -- train "$fc" "${gpt[@]}" --set data.tokenizer=byt --out "$T/gpt_byt"
run generate "$fc" "${gpt[@]}" --checkpoint "$gck" --prompt "x" --tokens many
if [ "$rc" -eq 2 ] && printf '%s\n' "$err" | head -n 1 | grep -q "\-\-tokens: 'many' is not a whole number"; then
  pass
else
  fail "generate: a bad --tokens is a usage error" "rc $rc" "$err"
fi
# numbers past what the sampler holds are usage errors, not wrapped or
# rounded to infinity: 3e9 tokens was cast to int, 1e300 became an
# infinite temperature, "0x10" read as 16 and "-1" as 2^64 - 1
for bad in "--tokens 3000000000" "--tokens 0x10" "--temperature 1e300" \
  "--temperature -0.5" "--top-k 1e3" "--seed -1" "--seed 18446744073709551616"; do
  read -r opt val <<<"$bad"
  run generate "$fc" "${gpt[@]}" --checkpoint "$gck" --prompt "x" "$opt" "$val"
  if [ "$rc" -eq 2 ] && printf '%s\n' "$err" | head -n 1 | grep -q -- "^strata: error: $opt: '$val' is not a"; then
    pass
  else
    fail "generate: $bad is a usage error" "rc $rc" "$err"
  fi
done
: >"$T/empty.txt"
expect_error "gpt: empty corpus" "$(re_quote "$T/empty.txt"): the corpus is empty" \
  -- train "$fc" "${gpt[@]}" --set data.path="$T/empty.txt" --out "$T/o_gpt_empty"
printf 'good line\nbad \xff byte\n' >"$T/latin.txt"
expect_error "gpt: corpus not UTF-8 as configured" \
  "$(re_quote "$T/latin.txt"):2:5: byte 0xFF is not valid UTF-8" \
  -- train "$fc" "${gpt[@]}" --set data.encoding=utf8 --set data.path="$T/latin.txt" --out "$T/o_gpt_utf8"
head -c 20 "$T/corpus.txt" >"$T/short.txt"
expect_error "gpt: corpus shorter than a sequence" \
  "$(re_quote "$T/short.txt"): .* each part needs more than model.context = 16" \
  -- train "$fc" "${gpt[@]}" --set data.path="$T/short.txt" --out "$T/o_gpt_short"
expect_error "gpt: vocabulary below the tokenizer's" \
  "model.vocab: 100, but the tokenizer \(bytes\) makes ids up to 255" \
  -- train "$fc" "${gpt[@]}" --set model.vocab=100 --out "$T/o_gpt_vocab"
expect_error "gpt needs text data" "--set: model.kind: gpt trains on data.dataset text, not fashion_mnist \(set at configs/fc_mnist.yaml:8:12\)" \
  -- train "$fc" --set model.kind=gpt --out "$T/o_gpt_data"
expect_error "gpt: heads must divide the width" "model.heads: 3 heads do not split model.width 16 evenly" \
  -- train "$fc" "${gpt[@]}" --set model.heads=3 --out "$T/o_gpt_heads"

# --- 8c. the pipeline mode through the command ------------------------------
# Replicas each run their share of the batch: at batch 2 over 2 replicas
# of micro-batches of 1, each pipeline holds M = 1 < S = 2, and the bubble
# line says which figure it gives (it took M from the whole batch).
run train "$fc" --set data.dataset=synthetic --set data.train_limit=64 \
  --set data.test_limit=32 --set train.steps=3 --set train.batch=2 \
  --set execution.mode=pipeline --set execution.schedule=zb1p \
  --set execution.stages=2 --set execution.replicas=2 \
  --set execution.micro_batch=1 --set metrics.progress=off --out "$T/p_zbr"
if [ "$rc" -eq 0 ] && grep -q "by zb1p's bubble at S = 2 (ops of equal cost; its span on the emulated clock, M < S)" <<<"$out"; then
  pass
else
  fail "replicas: the bubble line counts a replica's micro-batches" "rc $rc" "$out" "$err"
fi
# Three stages, four micro-batches: the same checkpoint, byte for byte, as
# the sequential mode at the same split; and the plan has the run's stages.
pipe_args=(--set data.train_limit=512 --set data.test_limit=64 --set train.steps=12
           --set train.batch=16 --set execution.micro_batch=4 --set metrics.progress=off)
run train "$fc" "${pipe_args[@]}" --out "$T/p_seq"
run train "$fc" "${pipe_args[@]}" --set execution.mode=pipeline --set execution.stages=3 \
  --set execution.schedule=gpipe --out "$T/p_pipe"
if [ "$rc" -eq 0 ] && cmp -s "$T/p_seq/checkpoints/step-00000012.safetensors" \
     "$T/p_pipe/checkpoints/step-00000012.safetensors"; then
  pass
else
  fail "pipeline checkpoint equals sequential's byte for byte" "rc $rc" "$err"
fi
# every file the run wrote is one that train --help and README.md's table
# name (schedule.svg and plan.json were in neither --help nor the table)
run train --help
for f in "$T/p_pipe"/* store.strata; do
  f=${f##*/}
  if grep -q "^  DIR/$f[/ ]" <<<"$out" && grep -Eq "^\| \`$f[/\`]|^\| .*, \`$f\` \|" README.md; then pass; else
    fail "train --help and README.md name $f, which a pipeline run writes"; fi
done
# sequential replicas: a stage each, no pipeline, so no bubble formula
run train "$fc" "${pipe_args[@]}" --set execution.replicas=2 --out "$T/p_rep"
if [ "$rc" -eq 0 ] && grep -Eq "^strata:   replica 1 stage 0 +0-2 " <<<"$out" &&
   grep -Eq "^strata: replica utilization [01]\.[0-9]{2} measured \(busy share of the wall time; one stage each, no pipeline bubble\)$" <<<"$out" &&
   ! grep -q "bubble at S" <<<"$out"; then
  pass
else
  fail "sequential replicas: their busy shares, no bubble formula" "rc $rc" "$out" "$err"
fi
# a micro-batch of the whole batch is micro_batch 0 (each replica runs its
# share whole): accepted, and the same checkpoint byte for byte
run train "$fc" "${pipe_args[@]}" --set execution.replicas=2 \
  --set execution.micro_batch=0 --out "$T/p_rep_zero"
run train "$fc" "${pipe_args[@]}" --set execution.replicas=2 \
  --set execution.micro_batch=16 --out "$T/p_rep_whole"
if [ "$rc" -eq 0 ] && cmp -s "$T/p_rep_zero/checkpoints/step-00000012.safetensors" \
     "$T/p_rep_whole/checkpoints/step-00000012.safetensors"; then
  pass
else
  fail "replicas: micro_batch = train.batch trains as micro_batch 0" "rc $rc" "$err"
fi
expect_error "replicas: a micro-batch above a replica's share" \
  "--set: execution.replicas: train.batch = 16 \(set by --set\) does not split into 4 replicas of whole micro-batches \(execution.micro_batch = 8\)" \
  -- train "$fc" "${pipe_args[@]}" --set execution.replicas=4 \
  --set execution.micro_batch=8 --out "$T/o_rep_share"
# more replicas than the fabric's cores (one, set): no plan, but the run
# still says how fast it trained (tools/run-bench.sh reads that line)
run train "$fc" "${pipe_args[@]}" --set fabric.cores=1 --set execution.replicas=2 \
  --set train.threads=2 --set train.batch=8 --out "$T/p_rep_over"
if [ "$rc" -eq 0 ] && grep -q "warning: no plan" <<<"$err" &&
   grep -Eq "^strata: training rate: measured [1-9][0-9]* samples/s \(no plan to compare it with\)$" <<<"$out"; then
  pass
else
  fail "replicas past the cores: no plan, the measured rate all the same" "rc $rc" "$out" "$err"
fi
# a calibration profile that cannot be read: no plan, so the pipeline's
# stages come from the FLOP balance (the least most-loaded stage): blocks
# of 784x1024, 1024x64, 64x64 and 64x10 weights give {0} | {1, 2, 3}
# (803k against 70k multiply-adds a sample), not the even count {0, 1} |
# {2, 3}
printf 'garbage\n' >"$T/bad_profile.json"
STRATA_CALIBRATION="$T/bad_profile.json" run train "$fc" "${pipe_args[@]}" \
  --set model.hidden=[1024,64,64] --set execution.mode=pipeline --set execution.stages=2 \
  --out "$T/p_noplan"
if [ "$rc" -eq 0 ] && grep -q "^strata: warning: no plan: $(re_quote "$T/bad_profile.json"): calibration profile" <<<"$err" &&
   grep -Eq "^strata:   stage 0 +0-0 " <<<"$out" && grep -Eq "^strata:   stage 1 +1-3 " <<<"$out"; then
  pass
else
  fail "no plan (an unreadable profile): the pipeline's stages by the FLOP balance" "rc $rc" "$out" "$err"
fi
# block_sequential: segments of one block, each its own stage; the same
# bytes again. The run prints each stage's busy fraction and the measured
# utilization beside the bubble formula, each stage's time per sample beside
# the plan's where the plan cut the same blocks; summary.json has them; --trace
# writes a Chrome trace with a track per stage.
run train "$fc" "${pipe_args[@]}" --set execution.mode=block_sequential \
  --set execution.blocks_per_segment=1 --out "$T/p_bseq" --trace "$T/p_bseq.json"
if [ "$rc" -eq 0 ] && cmp -s "$T/p_seq/checkpoints/step-00000012.safetensors" \
     "$T/p_bseq/checkpoints/step-00000012.safetensors"; then
  pass
else
  fail "block_sequential checkpoint equals sequential's byte for byte" "rc $rc" "$err"
fi
if grep -Eq "^strata:   segment 0 stage 0 +0-0 +[01]\.[0-9]{2} +[0-9]+\.[0-9] us +([0-9.]+ us|-)$" <<<"$out" &&
   grep -Eq "^strata:   segment 2 stage 0 +2-2 +[01]\.[0-9]{2} +[0-9]+\.[0-9] us" <<<"$out" &&
   grep -Eq "pipeline utilization [01]\.[0-9]{2} measured.* by gpipe's bubble at S = 1 \(ops of equal cost; M/\(M\+S-1\)\)" <<<"$out" &&
   grep -q '"utilization_bubble": 1.0000' "$T/p_bseq/summary.json" &&
   grep -q '"name": "segment 2 stage 0", "blocks": \[2, 2\], "busy_fraction"' "$T/p_bseq/summary.json" &&
   grep -q '"utilization_plan": null' "$T/p_bseq/summary.json"; then
  pass
else
  fail "block_sequential: stage busy fractions and utilization" "$out"
fi
if grep -q '"traceEvents"' "$T/p_bseq.json" &&
   grep -q '"tid":2,"name":"thread_name","args":{"name":"segment 2 stage 0"}' "$T/p_bseq.json" &&
   [ "$(grep -c '"tid":1,"name":"forward"' "$T/p_bseq.json")" -eq 48 ]; then
  pass
else
  fail "--trace: a track per stage, 12 steps x 4 forwards on each" "$(head -c 400 "$T/p_bseq.json")"
fi
run eval "$fc" --checkpoint "$T/p_seq/checkpoints/step-00000012.safetensors" --trace "$T/x.json"
if [ "$rc" -eq 2 ] && grep -q "^strata: error: --trace is an option of train$" <<<"$err"; then pass; else
  fail "--trace belongs to train (a usage error)" "rc $rc" "$err"
fi
expect_error "pipeline: more stages than blocks" \
  "^strata: error: --set: execution.stages: 7 stages for a model of 3 blocks; each stage needs at least one block$" \
  -- train "$fc" "${pipe_args[@]}" --set execution.mode=pipeline --set execution.stages=7 --out "$T/o_pipe7"
# Pipelined backprop through the command: the threaded run (the stages going
# from one step into the next between evaluations and checkpoints) writes
# every checkpoint byte for byte as its single-threaded emulation does with
# an evaluation after every step (so no step ever starts early there).
pb_args=(--set data.train_limit=600 --set data.test_limit=64 --set model.hidden=[32,32,32]
         --set execution.mode=pipelined_backprop --set execution.stages=2
         --set optimizer.nesterov=false --set optimizer.lr=0.002 --set train.batch=8
         --set train.epochs=3 --set train.eval_every=20 --set train.checkpoint_every=30
         --set metrics.progress=off)
run train "$fc" "${pb_args[@]}" --out "$T/pb_thr"
rc_thr=$rc
run train "$fc" "${pb_args[@]}" --set execution.emulate=true --set train.eval_every=1 \
  --out "$T/pb_emu"
pb_same=1
for f in "$T"/pb_emu/checkpoints/step-*.safetensors; do
  cmp -s "$f" "$T/pb_thr/checkpoints/${f##*/}" || pb_same=0
done
n_ck=$(find "$T/pb_thr/checkpoints" -name 'step-*.safetensors' | wc -l)
if [ "$rc_thr" -eq 0 ] && [ "$rc" -eq 0 ] && [ "$pb_same" -eq 1 ] && [ "$n_ck" -ge 2 ]; then
  pass
else
  fail "pipelined backprop: threaded checkpoints equal the emulator's" "rc $rc_thr/$rc, $n_ck checkpoints, same $pb_same" "$err"
fi
# its summary carries the utilization its busy times allow (the replay with
# free hand-offs); block_sequential's has none
if grep -Eq '"utilization_allowed": (0\.[0-9]{4}|1\.0000),' "$T/pb_thr/summary.json" &&
   grep -q '"utilization_allowed": null,' "$T/p_bseq/summary.json"; then
  pass
else
  fail "pipelined backprop: utilization_allowed in summary.json" "$(grep utilization "$T/pb_thr/summary.json")"
fi
# every micro-batch is an update, and a resume counts the updates so far by
# the micro-batch: one other than the checkpoint's is refused (the run's
# config.yaml kept), the same one continues
cp -r "$T/pb_thr" "$T/pb_mb"
expect_error "resume pipelined backprop with another micro-batch" \
  "^strata: error: .*step-00000225\.safetensors: written with pipelined_backprop's micro-batch 1, the config \(execution.micro_batch\) gives 2: resuming would not continue the same run$" \
  -- train - --resume "$T/pb_mb" --set execution.micro_batch=2 --set train.epochs=4
grep -q "^  micro_batch: 0$" "$T/pb_mb/config.yaml" && pass ||
  fail "a refused resume leaves the run's config.yaml" "$(grep micro_batch "$T/pb_mb/config.yaml")"
run train - --resume "$T/pb_mb" --set execution.micro_batch=1 --set train.epochs=4
if [ "$rc" -eq 0 ] && grep -q "^strata: resumed from .*step-00000225.safetensors at step 225$" <<<"$out"; then pass; else
  fail "resume pipelined backprop with its own micro-batch" "rc $rc" "$err"
fi

# --- 8d. weight streaming from a file store ----------------------------------
# The store is the run's checkpoint: a run killed with SIGKILL at a random
# moment and resumed ends with the sequential run's checkpoint byte for
# byte (exported from the store); a store is never overwritten by a new run.
ws_args=(--set data.train_limit=2048 --set data.test_limit=64 --set train.steps=300
         --set train.batch=64 --set metrics.progress=off)
ws_file=(--set execution.mode=weight_streaming --set execution.store=file)
run train "$fc" "${ws_args[@]}" --out "$T/w_seq"
"$strata" train "$fc" "${ws_args[@]}" "${ws_file[@]}" --out "$T/w_ws" >/dev/null 2>&1 &
ws_pid=$!
# once training has started (the store and config.yaml are written), a
# random moment within the next half second
for _ in $(seq 200); do
  [ -e "$T/w_ws/store.strata" ] && [ -e "$T/w_ws/config.yaml" ] && break
  sleep 0.05
done
sleep "0.$((RANDOM % 5))"
kill -9 "$ws_pid" 2>/dev/null
wait "$ws_pid" 2>/dev/null
ws_rc=$?
run train - --resume "$T/w_ws" "${ws_args[@]}"
if [ "$rc" -eq 0 ] && grep -q "^strata: resumed from the store $(re_quote "$T/w_ws/store.strata") at step" <<<"$out"; then
  pass
else
  fail "a killed weight-streaming run resumes from its store (killed: rc $ws_rc)" "rc $rc" "$out" "$err"
fi
run export "$T/w_ws"
if [ "$rc" -eq 0 ] && cmp -s "$T/w_seq/checkpoints/step-00000300.safetensors" \
     "$T/w_ws/checkpoints/step-00000300.safetensors"; then
  pass
else
  fail "killed (rc $ws_rc), resumed and exported: the sequential checkpoint byte for byte" "rc $rc" "$out" "$err"
fi
# the exported checkpoint is the run's newest; a store committed after it
# holds newer weights, and one with no checkpoint has nothing to read
run eval "$fc" "${ws_args[@]}" --checkpoint "$T/w_ws"
if [ "$rc" -eq 0 ] && grep -q "^test accuracy [01]\.[0-9]*, test loss [0-9.]* ($(re_quote "$T/w_ws/checkpoints/step-00000300.safetensors"))$" <<<"$out"; then pass; else
  fail "eval of a store's run after its export: the exported checkpoint" "rc $rc" "$out" "$err"
fi
# and with the run's own config.yaml (CONFIG '-', a file store's config):
# the weights come from the export, not from a store (refused before: the
# store needs a run's folder)
fc_eval=$out
run eval - --checkpoint "$T/w_ws"
if [ "$rc" -eq 0 ] && [ "$out" = "$fc_eval" ]; then pass; else
  fail "eval - of a store's run after its export: its own config, the same figures" "rc $rc" "$out" "$err"
fi
# (by step numbers, not file times: a copied folder's times say nothing)
cp -rp "$T/w_ws" "$T/w_ws_copy"
touch "$T/w_ws_copy/checkpoints/"*
touch -d '+1 minute' "$T/w_ws_copy/store.strata"
run eval "$fc" "${ws_args[@]}" --checkpoint "$T/w_ws_copy"
if [ "$rc" -eq 0 ] && grep -q "($(re_quote "$T/w_ws_copy/checkpoints/step-00000300.safetensors"))$" <<<"$out"; then pass; else
  fail "eval of a copied store's run: its export of the same step, whatever the file times" "rc $rc" "$out" "$err"
fi
run train - --resume "$T/w_ws_copy" --set train.steps=302
expect_error "eval of a store's run committed after its export" \
  "^strata: error: $(re_quote "$T/w_ws_copy"): the run keeps its weights in its store \($(re_quote "$T/w_ws_copy/store.strata"), step 302\); its newest checkpoint is step 300: .strata export $(re_quote "$T/w_ws_copy"). writes them as a safetensors file$" \
  -- eval "$fc" "${ws_args[@]}" --checkpoint "$T/w_ws_copy"
# a store kept outside the run's folder (execution.store_path): the run's
# config.yaml says where
run train "$fc" "${ws_args[@]}" "${ws_file[@]}" --set train.steps=5 \
  --set "execution.store_path=$T/elsewhere.strata" --out "$T/w_else"
run export "$T/w_else"
run train - --resume "$T/w_else" --set train.steps=7
expect_error "eval of a run whose store is elsewhere, committed after its export" \
  "^strata: error: $(re_quote "$T/w_else"): the run keeps its weights in its store \($(re_quote "$T/elsewhere.strata"), step 7\); its newest checkpoint is step 5: " \
  -- eval "$fc" "${ws_args[@]}" --checkpoint "$T/w_else"
# --out naming the store itself: refused, the store left as it was (the
# checkpoint was renamed over it: the run could not resume)
cp "$T/elsewhere.strata" "$T/elsewhere.before"
expect_error "export --out the run's own store" \
  "^strata: error: --out $(re_quote "$T/elsewhere.strata") is the run's store $(re_quote "$T/elsewhere.strata"): the checkpoint would be written over it; give another --out$" \
  -- export "$T/w_else" --out "$T/elsewhere.strata"
if cmp -s "$T/elsewhere.before" "$T/elsewhere.strata"; then pass; else
  fail "export --out the run's own store leaves the store as it was"
fi
mkdir -p "$T/w_store_only"
cp "$T/w_ws/store.strata" "$T/w_store_only/"
expect_error "eval of a store's run never exported" \
  "^strata: error: $(re_quote "$T/w_store_only"): the run keeps its weights in its store \($(re_quote "$T/w_store_only/store.strata"), step 300\), not in checkpoints: .strata export" \
  -- eval "$fc" "${ws_args[@]}" --checkpoint "$T/w_store_only"
expect_error "a new run over an earlier run's store" \
  "^strata: error: $(re_quote "$T/w_ws"): holds an earlier run \(.*$(re_quote "$T/w_ws/store.strata").*\): --resume $(re_quote "$T/w_ws") continues it, --overwrite replaces it" \
  -- train "$fc" "${ws_args[@]}" "${ws_file[@]}" --out "$T/w_ws"
expect_error "--resume with no run" \
  "^strata: error: $(re_quote "$T/w_none/config.yaml"): cannot open: no run to resume$" \
  -- train "$fc" "${ws_args[@]}" "${ws_file[@]}" --resume "$T/w_none"
# a run without a store: its newest checkpoint is one file already (said,
# and copied with --out)
run export "$T/w_seq"
if [ "$rc" -eq 0 ] && grep -q "^strata: $(re_quote "$T/w_seq")/checkpoints/step-[0-9]*\.safetensors is one file already: step [0-9]*$" <<<"$out"; then
  pass
else
  fail "export of a run without a store: its checkpoint is one file already" "rc $rc" "$out" "$err"
fi
newest=$(ls "$T/w_seq/checkpoints/"step-*.safetensors | tail -n 1)
run export "$T/w_seq" --out "$T/w_seq_copy.safetensors"
if [ "$rc" -eq 0 ] && cmp -s "$newest" "$T/w_seq_copy.safetensors"; then pass; else
  fail "export --out of a single-file checkpoint: the same bytes" "rc $rc" "$err"
fi
# damaged (one byte of its last tensor's data flipped): named, not copied
cp -r "$T/w_seq" "$T/w_seq_bad"
bad=$(ls "$T/w_seq_bad/checkpoints/"step-*.safetensors | tail -n 1)
size=$(stat -c %s "$bad")
printf '\377' | dd of="$bad" bs=1 seek=$((size - 3)) conv=notrunc 2>/dev/null
expect_error "export --out of a damaged single-file checkpoint" \
  "^strata: error: $(re_quote "$bad"): tensor '[^']*' is damaged" \
  -- export "$T/w_seq_bad" --out "$T/w_seq_bad_copy.safetensors"
if [ ! -e "$T/w_seq_bad_copy.safetensors" ]; then pass; else
  fail "export of a damaged checkpoint writes nothing" "$(ls -la "$T/w_seq_bad_copy.safetensors")"
fi
expect_error "a store path in a missing folder" \
  "^strata: error: $(re_quote "$T/nowhere/s.strata"): cannot create: No such file or directory$" \
  -- train "$fc" "${ws_args[@]}" "${ws_file[@]}" --set "execution.store_path=$T/nowhere/s.strata" --out "$T/o_ws_nowhere"
# a store path naming a file of the user's, or a folder: refused, even
# under --overwrite (it replaced the file with a store), the file as it was
# and no run folder made
echo "keep me" >"$T/precious.txt"
expect_error "a store path naming another file, --overwrite" \
  "^strata: error: execution.store_path: $(re_quote "$T/precious.txt") is not a weight store \(no store header\): a run makes its store there, and never over another file; give another path$" \
  -- train "$fc" "${ws_args[@]}" "${ws_file[@]}" --set "execution.store_path=$T/precious.txt" --out "$T/o_ws_precious" --overwrite
expect_error "export --out a folder" \
  "^strata: error: --out $(re_quote "$T"): a folder, not a file: give a file's path$" \
  -- export "$T/w_seq" --out "$T"
# --out naming what the export reads: the run's config.yaml (written over,
# the run could no longer be read), a file in the sharded checkpoint's
# folder (the merged file renamed over its index or a shard, or put beside
# them): refused, the run as it was
cp "$T/w_seq/config.yaml" "$T/w_seq_config.before"
expect_error "export --out the run's config.yaml" \
  "^strata: error: --out $(re_quote "$T/w_seq/config.yaml") is the run's config $(re_quote "$T/w_seq/config.yaml"): the checkpoint would be written over it; give another --out$" \
  -- export "$T/w_seq" --out "$T/w_seq/config.yaml"
if cmp -s "$T/w_seq_config.before" "$T/w_seq/config.yaml"; then pass; else
  fail "export --out the run's config.yaml leaves it as it was"
fi
run train "$fc" "${small[@]}" --set train.checkpoint_format=shards --out "$T/x_shards"
sck="$T/x_shards/checkpoints/step-00000020"
cp -r "$sck" "$T/x_shards_before"
for o in model.safetensors.index.json model-00001-of-00001.safetensors merged.safetensors; do
  expect_error "export --out $o in the sharded checkpoint's folder" \
    "^strata: error: --out $(re_quote "$sck/$o") is inside the sharded checkpoint $(re_quote "$sck") that the export reads: the file would be written among its shards; give another --out$" \
    -- export "$T/x_shards" --out "$sck/$o"
done
if diff -r "$T/x_shards_before" "$sck" >/dev/null; then pass; else
  fail "export --out into the sharded checkpoint leaves it as it was" "$(ls -la "$sck")"
fi
expect_error "a store path naming a folder" \
  "^strata: error: execution.store_path: $(re_quote "$T") is not a weight store \(a directory\)" \
  -- train "$fc" "${ws_args[@]}" "${ws_file[@]}" --set "execution.store_path=$T" --out "$T/o_ws_folder"
if [ "$(cat "$T/precious.txt")" = "keep me" ] && [ ! -e "$T/o_ws_precious" ] && [ ! -e "$T/o_ws_folder" ]; then pass; else
  fail "a refused store path: the file as it was, no run folder" "$(ls "$T")"
fi
# --out a folder holding a config of the user's (train config.yaml --out
# . wrote the resolved config over the one it read): refused, untouched
mkdir -p "$T/own" && cp "$fc" "$T/own/config.yaml"
expect_error "--out a folder with a config.yaml of the user's" \
  "^strata: error: $(re_quote "$T/own")/config.yaml: not a run's config \(strata writes a run's resolved config there, and never over a file of yours\): give another --out$" \
  -- train "$T/own/config.yaml" "${ws_args[@]}" --out "$T/own"
if cmp -s "$fc" "$T/own/config.yaml"; then pass; else
  fail "the user's config.yaml as it was"
fi

# A store of bf16 weights: the summary says so, the export writes BF16
# weights (inspect reads them), and evaluating the export gives the run's
# final test loss and accuracy to the printed digit (the same widened
# weights); resuming it as fp32 is refused.
run train "$fc" "${ws_args[@]}" "${ws_file[@]}" --set train.steps=40 \
  --set execution.store_weights=bf16 --set execution.store_rounding=stochastic --out "$T/w_bf16"
bf16_done=$(grep -o "test accuracy .*, test loss [0-9.]*" <<<"$out")
if [ "$rc" -eq 0 ] && grep -q "^strata: store $(re_quote "$T/w_bf16/store.strata") (bf16 weights) committed step 40;" <<<"$out"; then
  pass
else
  fail "a bf16 store trains and says so" "rc $rc" "$out" "$err"
fi
run export "$T/w_bf16" --out "$T/w_bf16.safetensors"
ins=$("$strata" inspect "$T/w_bf16.safetensors" 2>&1)
if [ "$rc" -eq 0 ] && grep -Eq "^  blocks\.0\.linear0\.weight +BF16 +256x784 +-?[0-9]" <<<"$ins" &&
   grep -Eq "^  optim\.blocks\.0\.linear0\.weight\.momentum +F32 " <<<"$ins"; then
  pass
else
  fail "a bf16 store exports BF16 weights and F32 state" "rc $rc" "$ins"
fi
# against an fp32 run's checkpoint of the same tensors: compared as the
# values they hold (it was refused: "another dtype or shape")
run inspect "$T/w_bf16.safetensors" --against "$T/w_seq_copy.safetensors"
if [ "$rc" -eq 0 ] && grep -Eq "^  blocks\.0\.linear0\.weight +max \|a - b\| [0-9]" <<<"$out" &&
   grep -Eq "^largest difference [0-9.e+-]+ \(" <<<"$out"; then
  pass
else
  fail "inspect --against a bf16 export and an fp32 checkpoint" "rc $rc" "$out" "$err"
fi
run eval "$fc" "${ws_args[@]}" --checkpoint "$T/w_bf16.safetensors"
if [ "$rc" -eq 0 ] && [ -n "$bf16_done" ] && grep -q "^$bf16_done " <<<"$out"; then
  pass
else
  fail "the bf16 export evaluates as the run ended ($bf16_done)" "rc $rc" "$out" "$err"
fi
# under the run's own config, whose store holds bf16 weights
run eval "$T/w_bf16/config.yaml" --checkpoint "$T/w_bf16.safetensors"
if [ "$rc" -eq 0 ] && [ -n "$bf16_done" ] && grep -q "^$bf16_done " <<<"$out"; then
  pass
else
  fail "the bf16 export evaluates under the run's config.yaml as the run ended ($bf16_done)" "rc $rc" "$out" "$err"
fi
expect_error "a bf16 store resumed as fp32" \
  "^strata: error: $(re_quote "$T/w_bf16/store.strata"): the store holds bf16 weights; this config's execution.store_weights is fp32$" \
  -- train - --resume "$T/w_bf16" "${ws_args[@]}" --set execution.store_weights=fp32
# a store whose headers are both damaged, or of another format version, is
# a store: resumed, the error says what is wrong with it, not that the path
# names some other file
# both_slots FILE BYTES OFFSET: BYTES (printf's format) at OFFSET of each of
# the store's two 4 KiB header slots
both_slots() {
  local at
  for at in "$3" $(($3 + 4096)); do
    printf "$2" | dd of="$1" bs=1 seek="$at" conv=notrunc 2>/dev/null
  done
}
cp -r "$T/w_bf16" "$T/w_bad_hdr"
both_slots "$T/w_bad_hdr/store.strata" 'xx' 40
expect_error "a store with both headers damaged, resumed" \
  "^strata: error: $(re_quote "$T/w_bad_hdr/store.strata"): no valid header \(both header slots fail their checksum\): the store is corrupt$" \
  -- train - --resume "$T/w_bad_hdr" "${ws_args[@]}"
cp -r "$T/w_bf16" "$T/w_old_ver"
both_slots "$T/w_old_ver/store.strata" '\002' 8
expect_error "a store of another format version, resumed" \
  "^strata: error: $(re_quote "$T/w_old_ver/store.strata"): a store of format version 2; this strata reads version [0-9]+ " \
  -- train - --resume "$T/w_old_ver" "${ws_args[@]}"
# a store of the version-4 layout as written before the position grew by
# data.normalize (fc400ab: 8 bytes) and pipelined backprop's micro-batch
# (8 more, under version 5): the header 224 bytes, not 240. The header
# slots rewritten so, checksums and all (byte for byte the store the strata
# of fc400ab^ writes). It is a store of an older format, not a corrupt one.
cp -r "$T/w_bf16" "$T/w_v4"
python3 - "$T/w_v4/store.strata" <<'PY'
import struct, sys, zlib
with open(sys.argv[1], "r+b") as f:
    for at in (0, 4096):
        f.seek(at)
        slot = f.read(4096)
        size = struct.unpack_from("<I", slot, 12)[0]  # the header's bytes
        pos_end = size - 16  # then sum, pad, crc and 4 bytes of padding
        old = bytearray(slot[:pos_end - 16] + slot[pos_end:pos_end + 8])
        struct.pack_into("<II", old, 8, 4, size - 16)  # version 4, its size
        old += struct.pack("<I", zlib.crc32(bytes(old)))
        f.seek(at)
        f.write(bytes(old).ljust(4096, b"\0"))
PY
expect_error "a store of the earlier version-4 layout, resumed" \
  "^strata: error: $(re_quote "$T/w_v4/store.strata"): a store of format version 4; this strata reads version [0-9]+ \(export it with the strata that wrote it\)$" \
  -- train - --resume "$T/w_v4" "${ws_args[@]}"
cp -r "$T/w_bf16" "$T/w_cut_hdr"
truncate -s 100 "$T/w_cut_hdr/store.strata"
expect_error "a store cut inside its header slots, resumed" \
  "^strata: error: $(re_quote "$T/w_cut_hdr/store.strata"): truncated: 100 bytes, less than the store's two header slots \(8192\)$" \
  -- train - --resume "$T/w_cut_hdr" "${ws_args[@]}"
# A run on a read-only file system (an archive) still exports: the store
# is opened read-only and gives the same bytes. Needs a read-only bind
# mount, which root can make here; elsewhere this is said and not counted.
mkdir -p "$T/ro"
if mount --bind "$T/w_bf16" "$T/ro" 2>/dev/null && mount -o remount,bind,ro "$T/ro" 2>/dev/null &&
   ! touch "$T/ro/probe" 2>/dev/null; then
  run export "$T/ro" --out "$T/w_bf16_ro.safetensors"
  if [ "$rc" -eq 0 ] && cmp -s "$T/w_bf16.safetensors" "$T/w_bf16_ro.safetensors"; then pass; else
    fail "a store on a read-only file system exports the same bytes" "rc $rc" "$out" "$err"
  fi
else
  echo "note: no read-only bind mount here (not root?): the read-only export is not tested"
fi
umount "$T/ro" 2>/dev/null
# a store is not a checkpoint: inspect and eval say what it is
expect_error "inspect of a store" \
  "^strata: error: $(re_quote "$T/w_bf16/store.strata"): a weight-streaming store, not safetensors: .strata export RUN_DIR. writes its weights as a checkpoint$" \
  -- inspect "$T/w_bf16/store.strata"

# --- 8b. keys the mode does not use --------------------------------------------
# A user switches modes by changing one word: a key set for another mode gets
# one notice line naming the key, where it was set and the mode, and the run
# goes on; keys left at their defaults, or that the mode reads, get none.
run train "$fc" "${small[@]}" --set execution.stages=4 \
  --set execution.mitigation=pipemare --set execution.emulate=true \
  --set execution.schedule=1f1b --set 'execution.stage_blocks=[1,1]' \
  --out "$T/unused_seq"
if [ "$rc" -eq 0 ]; then pass; else fail "unused keys: run goes on" "rc $rc" "$err"; fi
n_notice=$(printf '%s\n' "$err" | grep -c '^strata: notice: ')
if [ "$n_notice" -eq 4 ]; then pass; else
  fail "unused keys: one notice each (stages, stage_blocks, mitigation, emulate)" "$err"; fi
for key in execution.stages execution.stage_blocks execution.mitigation execution.emulate; do
  if printf '%s\n' "$err" | grep -Eq "^strata: notice: --set: $(re_quote "$key") is not used by execution\.mode sequential; ignored$"; then
    pass; else fail "unused keys: notice for $key" "$err"; fi
done
run train "$fc" "${small[@]}" --set execution.mode=pipeline \
  --set execution.stages=2 --set execution.mitigation=sc --set execution.virtual_stages=3 \
  --out "$T/unused_pipe"
if [ "$rc" -eq 0 ] && printf '%s\n' "$err" | grep -q 'execution.mitigation is not used by execution.mode pipeline' &&
   ! printf '%s\n' "$err" | grep -q 'execution.stages is not used'; then pass; else
  fail "unused keys: pipeline reads stages, not mitigation" "rc $rc" "$err"; fi
# virtual_stages is the interleaved schedule's alone (it was ignored silently)
if printf '%s\n' "$err" | grep -q '^strata: notice: --set: execution.virtual_stages is not used by execution.schedule 1f1b; ignored$'; then
  pass; else fail "unused keys: virtual_stages under 1f1b" "$err"; fi

# Keys the model kind, optimizer, schedule or dataset does not read get the
# same notice (they were ignored without a word: model.channels under an mlp,
# optimizer.beta1 under sgd, min_lr under the constant schedule), naming the
# file's line; a key the setting reads, or one set to its default, none.
printf 'model:\n  kind: mlp\n  channels: [8]\n  classes: 10\noptimizer:\n  kind: sgd\n  beta1: 0.95\n  beta2: 0.999\n  min_lr: 0.001\ndata:\n  val_fraction: 0.2\n' >"$T/dead.yaml"
run train "$T/dead.yaml" "${small[@]}" --set optimizer.kind=adamw --set optimizer.momentum=0.5 \
  --out "$T/unused_dead"
dead_train=$(printf '%s\n' "$err" | grep '^strata: notice: ')
want_dead="strata: notice: $T/dead.yaml:3:13: model.channels is not used by model.kind mlp; ignored
strata: notice: $T/dead.yaml:11:17: data.val_fraction is not used by data.dataset fashion_mnist; ignored
strata: notice: --set: optimizer.momentum is not used by optimizer.kind adamw; ignored
strata: notice: $T/dead.yaml:9:11: optimizer.min_lr is not used by optimizer.schedule constant; ignored"
if [ "$rc" -eq 0 ] && [ "$dead_train" = "$want_dead" ]; then pass; else
  fail "unused keys of the model, data, optimizer and schedule: one notice each" "rc $rc" \
    "want:" "$want_dead" "got:" "$err"; fi
# compile says what train says, of the same config
run compile "$T/dead.yaml" --validate-only --set optimizer.kind=adamw --set optimizer.momentum=0.5
if [ "$rc" -eq 0 ] && [ "$(printf '%s\n' "$err" | grep '^strata: notice: ')" = "$want_dead" ]; then
  pass; else fail "compile --validate-only: the notices train prints" "rc $rc" "$err"; fi
run compile "$fc" --set execution.stages=2 --set optimizer.beta1=0.95 --fabric cpu:2 --out "$T/unused_plan"
if [ "$rc" -eq 0 ] && [ "$(printf '%s\n' "$err" | grep -c '^strata: notice: ')" -eq 2 ] &&
   printf '%s\n' "$err" | grep -q '^strata: notice: --set: execution.stages is not used by execution.mode sequential; ignored$' &&
   printf '%s\n' "$err" | grep -q '^strata: notice: --set: optimizer.beta1 is not used by optimizer.kind sgd; ignored$'; then
  pass; else fail "compile: the notices train prints" "rc $rc" "$err"; fi
# --mode is the mode compile plans: a pipeline reads the stages
run compile "$fc" --set execution.stages=2 --fabric cpu:2 --mode pipeline --out "$T/unused_plan_pipe"
if [ "$rc" -eq 0 ] && ! printf '%s\n' "$err" | grep -q '^strata: notice: '; then
  pass; else fail "compile --mode pipeline: stages are read" "rc $rc" "$err"; fi
# every key a shipped config sets is read by it
for f in configs/*.yaml; do
  run compile "$f" --validate-only
  if [ "$rc" -eq 0 ] && ! printf '%s\n' "$err" | grep -q '^strata: notice: '; then
    pass; else fail "$f: every key it sets is read (compile --validate-only)" "rc $rc" "$err"; fi
done

# The bubble line names its closed form only where it holds: interleaved with
# M a multiple of S; otherwise the figure is the emulated clock's (M = 3
# printed 0.79 beside "(S-1)/VM", which gives 0.83 at S = 2, V = 2 ... )
for M in 3 4; do
  run train "$fc" "${small[@]}" --set model.hidden=[16,16,16] --set execution.mode=pipeline \
    --set execution.schedule=interleaved --set execution.stages=2 --set train.batch=$((2 * M)) \
    --set execution.micro_batch=2 --out "$T/il_m$M"
  if [ "$M" -eq 3 ]; then want="its span on the emulated clock, M not a multiple of S"; else want="(S-1)/VM of the ideal"; fi
  if [ "$rc" -eq 0 ] && grep -qF "by interleaved's bubble at S = 2 (ops of equal cost; $want)" <<<"$out"; then
    pass; else fail "interleaved M=$M: the bubble line names what it printed" "rc $rc" "$out" "$err"; fi
done

# --- 8z. the set-up contract ---------------------------------------------------
# `make test` on a fresh Debian installs what tools/install-deps.sh lists, and
# README.md names that list: every program the shell tests run beside strata
# must come from it (python3 and pgrep were missing: a container's Debian has
# neither, and the JSON checks and test_mpi's kills failed there).
deps=$(sed -n 's/^  "\([a-z0-9.+-]*\):.*"$/\1/p' tools/install-deps.sh | tr '\n' ' ')
for need in python3 procps openmpi-bin; do
  if [[ " $deps" == *" $need "* ]]; then pass; else
    fail "tools/install-deps.sh installs $need, which the shell tests run" "its list: $deps"; fi
done
readme=$(sed -n '/^Both start with `tools\/install-deps.sh`/,/`\./p' README.md | tr '\n' ' ' |
  sed 's/.*Debian packages: `\([^`]*\)`.*/\1/' | tr -s ' ')
if [ "$readme " = "$deps" ]; then pass; else
  fail "README.md names the packages tools/install-deps.sh installs" "README: $readme" "script: $deps"; fi

# Every `strata COMMAND ...` the docs show names a command, and each --option
# in it one that the command's --help lists (docs/bf16.md named a `strata
# calibrate`, which strata refuses as an unknown command).
cmds=$("$strata" --help | sed -n 's/^  \([a-z]*\) .*/\1/p' | tr '\n' ' ')
while read -r doc cmd opt; do
  if [[ " $cmds" != *" $cmd "* ]]; then
    fail "$doc shows \`strata $cmd\`, which is no command" "commands: $cmds"
  elif [ -n "$opt" ] && ! "$strata" "$cmd" --help | grep -q -- "$opt\b"; then
    fail "$doc shows \`strata $cmd ... $opt\`, which strata $cmd --help does not list"
  else pass; fi
done < <(grep -oE '`strata [a-z]+[^`]*`' README.md docs/*.md |
  grep -oE '^[^:`]*:|`strata [a-z]+|--[a-z][a-z-]*' |
  awk '/:$/ {doc = $0; next} /^`strata/ {cmd = $2; print doc, cmd; next} {print doc, cmd, $0}' |
  sort -u)

# --- 9. atomic writes ---------------------------------------------------------
# A checkpoint folder that cannot be made (a file is in the way) is found
# before the first step, not at the first checkpoint; no failing run above
# leaves a temporary.
mkdir -p "$T/blocked"
: >"$T/blocked/checkpoints"
expect_error "unwritable checkpoint folder" \
  "^strata: error: $(re_quote "$T/blocked/checkpoints"): cannot create: Not a directory$" \
  -- train "$fc" "${small[@]}" --out "$T/blocked"
if [ ! -e "$T/blocked/metrics.jsonl" ]; then pass; else
  fail "a checkpoint folder in the way is found before the first step"; fi
for dir in "$T"/o_* "$T/blocked" "$T/resume" "$nan_dir"; do
  [ -e "$dir" ] || continue
  no_tmp_left "failed run ${dir##*/}" "$dir"
done

finish
