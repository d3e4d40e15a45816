#!/usr/bin/env bash
# test_durable.sh — every file strata writes is written atomically and
# durably, seen from the calls it makes (tests/io/syncspy.c, preloaded,
# writes each fsync, fdatasync, rename, renameat2 and linkat down in order, and
# each pwrite into a file's first 8 KiB: a weight store's header slots):
#
#  - a file renamed into place was synced first, under its temporary name,
#    and its folder is synced after the rename, before anything else is
#    renamed (a crash then leaves the old file or the new one, whole);
#  - a weight store is synced whole in a file with no name (O_TMPFILE)
#    before it is linked into place (a link never replaces another), its
#    folder after;
#  - each commit of a store syncs the step's values, then writes the header
#    that names them, then syncs again: a header never names values that
#    are not on disk.
#
# No result of a run shows any of this: a run that never syncs gives the
# same files. Run by tools/run-tests.sh; closing line "N passed, N failed".
. "$(dirname "$0")/../harness.sh"

spy="$(dirname "$strata")/tests/io/syncspy.so"
if [ ! -f "$spy" ]; then
  fail "syncspy" "$spy is missing; run make tests first"
  finish
fi
# a sanitizer's runtime wants to come first; the spy only forwards calls
spied() {
  local log=$1
  shift
  LD_PRELOAD="$spy" SYNCSPY_LOG="$log" \
    ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0" \
    "$strata" "$@" >"$T/stdout" 2>"$T/stderr"
  rc=$?
}

# renamed_durably NAME LOG: every rename in LOG comes after a sync of its
# source and before a sync of its target's folder, with no other rename
# between them. Prints what is wrong; counts one check.
renamed_durably() {
  local name=$1 log=$2 why
  why=$(awk '
    { line[NR] = $0; op[NR] = $1; a[NR] = $2; b[NR] = $3 }
    END {
      renames = 0
      for (i = 1; i <= NR; i++) {
        if (op[i] != "rename" && op[i] != "renameat2" && op[i] != "linkat") continue
        renames++
        synced = 0
        for (j = i - 1; j >= 1; j--) {
          if ((op[j] == "fsync" || op[j] == "fdatasync") && a[j] == a[i]) { synced = 1; break }
          if (op[j] == "rename" || op[j] == "renameat2" || op[j] == "linkat") break
        }
        if (!synced) { print "not synced before its rename: " line[i]; bad = 1 }
        dir = b[i]; sub(/\/[^\/]*$/, "", dir)
        after = 0
        for (j = i + 1; j <= NR; j++) {
          if (op[j] == "fsync" && a[j] == dir) { after = 1; break }
          if (op[j] == "rename" || op[j] == "renameat2" || op[j] == "linkat") break
        }
        if (!after) { print "its folder not synced after: " line[i]; bad = 1 }
      }
      if (renames == 0) print "no rename at all"
    }' "$log")
  if [ -z "$why" ]; then pass; else fail "$name" "$why" "$(sed 's/^/  | /' "$log" | head -n 30)"; fi
}

fc=configs/fc_mnist.yaml
small=(--set data.train_limit=512 --set data.test_limit=64 --set metrics.progress=off)

# a run: its config, plan, checkpoints (two) and summary
spied "$T/run.log" train "$fc" "${small[@]}" --set train.steps=20 \
  --set train.checkpoint_every=10 --out "$T/run"
if [ "$rc" -eq 0 ] && [ "$(grep -c '^rename .*/checkpoints/step-000000[12]0\.safetensors$' "$T/run.log")" -eq 2 ] &&
   grep -q "^rename .*/summary\.json$" "$T/run.log" && grep -q "^rename .*/config\.yaml$" "$T/run.log"; then
  pass
else
  fail "a run renames its checkpoints, summary and config into place" "rc $rc" "$(cat "$T/stderr")" "$(cat "$T/run.log")"
fi
renamed_durably "a run's files: synced, renamed, their folder synced" "$T/run.log"

# a sharded checkpoint: each shard and then the index
spied "$T/shards.log" train "$fc" "${small[@]}" --set train.steps=4 \
  --set train.checkpoint_format=shards --out "$T/shards"
if [ "$rc" -eq 0 ] && grep -q "^rename .*/step-00000004/model\.safetensors\.index\.json$" "$T/shards.log"; then pass; else
  fail "a sharded checkpoint renames its index into place" "rc $rc" "$(cat "$T/stderr")" "$(cat "$T/shards.log")"
fi
renamed_durably "a sharded checkpoint: synced, renamed, its folder synced" "$T/shards.log"

# a tokenizer
printf 'the cat sat on the mat; the cat ate the rat.\n%.0s' $(seq 50) >"$T/corpus.txt"
spied "$T/tok.log" tokenize train "$T/corpus.txt" --vocab 300 --out "$T/tok.bpe"
if [ "$rc" -eq 0 ] && grep -q "^rename .* $(re_quote "$T/tok.bpe")$" "$T/tok.log"; then pass; else
  fail "tokenize train renames its file into place" "rc $rc" "$(cat "$T/stderr")" "$(cat "$T/tok.log")"
fi
renamed_durably "a tokenizer's file: synced, renamed, its folder synced" "$T/tok.log"

# a weight store: made whole, linked never over another, then committed
# three times, each commit sync, header (a pwrite into slot 0 or 1), sync
spied "$T/ws.log" train "$fc" "${small[@]}" --set train.steps=3 \
  --set execution.mode=weight_streaming --set execution.store=file --out "$T/ws"
store="$T/ws/store.strata"
if [ "$rc" -eq 0 ] && grep -q "^linkat $(re_quote "$T/ws")/#[0-9]* $(re_quote "$store")$" "$T/ws.log"; then pass; else
  fail "a store is made with no name and linked into place (never over another)" "rc $rc" "$(cat "$T/stderr")" "$(cat "$T/ws.log")"
fi
renamed_durably "a store and the run's files: synced, renamed, their folder synced" "$T/ws.log"
commits=$(awk -v s="$store" '
  $1 == "pwrite" && $2 == s && ($3 == 0 || $3 == 4096) {
    # the lines just before and after this header write
    if (prev_op == "fdatasync" && prev == s) want_after = 1
    else bad = bad "header not after a sync of the store at line " NR "\n"
    next
  }
  want_after {
    if ($1 == "fdatasync" && $2 == s) good++
    else bad = bad "header not followed by a sync of the store at line " NR "\n"
    want_after = 0
  }
  { prev_op = $1; prev = $2 }
  END { printf "%d\n%s", good, bad }' "$T/ws.log")
if [ "$(head -n 1 <<<"$commits")" -eq 3 ] && [ "$(wc -l <<<"$commits")" -eq 1 ]; then pass; else
  fail "each of 3 commits: the store synced, its header written, synced again" "$commits" "$(cat "$T/ws.log")"
fi

# a folder that cannot be synced: a failing disk stops the run with one
# line naming the folder; a file system that cannot sync folders (EINVAL),
# or a folder that cannot be read (EACCES), is taken at its word
SYNCSPY_FAIL_DIR=EIO spied "$T/failed.log" train "$fc" "${small[@]}" \
  --set train.steps=2 --out "$T/failed"
if [ "$rc" -eq 1 ] && [ "$(wc -l <"$T/stderr")" -eq 1 ] &&
   grep -q "^strata: error: $(re_quote "$T/failed"): cannot sync the folder: Input/output error" "$T/stderr"; then
  pass
else
  fail "a folder sync that fails (EIO): exit 1, one line naming the folder" "rc $rc" "$(cat "$T/stderr")"
fi
for e in EINVAL EACCES; do
  SYNCSPY_FAIL_DIR=$e spied "$T/$e.log" train "$fc" "${small[@]}" \
    --set train.steps=2 --set execution.mode=weight_streaming \
    --set execution.store=file --out "$T/$e"
  if [ "$rc" -eq 0 ] && [ -s "$T/$e/summary.json" ]; then pass; else
    fail "folders that cannot be synced ($e): the run goes on" "rc $rc" "$(cat "$T/stderr")"
  fi
done

finish
