#!/bin/bash
# tools/mutate.sh — `make mutate`: do the pipelined-backprop and noise
# scale tests catch a wrong formula? Each mutation below removes or alters
# one rule of BACKGROUND.md 2 or 5 in a scratch copy of the tree; the copy
# is rebuilt and the tests run; a mutation is caught when a test fails.
# Prints one line per mutation and `caught N of N`; exits 1 if any survived
# (or a mutation no longer applies, or does not build: the list must
# follow the code).
#
#   tools/mutate.sh [BUILD]      (BUILD: the build folder's name, "build")
#   MUTATE_ONLY=name tools/mutate.sh    one mutation
#
# The working tree is never touched: tracked and untracked-unignored files
# are copied to a scratch folder (MUTATE_DIR, default /tmp/strata-mutate),
# built there once unmutated (which must pass), then each mutation edits
# one file, rebuilds and restores it.
set -u
cd "$(dirname "$0")/.."
BUILD=${1:-build}
SCRATCH=${MUTATE_DIR:-/tmp/strata-mutate}
TESTS="exec/test_pb_ref exec/test_pb optim/test_optim exec/test_noise"

# name | file | Perl substitution applied to the whole file (s{...}{...}, or
# s#...#...# where the pattern holds a brace).
MUTATIONS=(
  "lwp: the prediction is the live weights|src/optim/optim.c|s{return w - k \* v;}{return w;}"
  "lwp: the prediction's sign flipped|src/optim/optim.c|s{return w - k \* v;}{return w + k * v;}"
  "lwp: horizon 1 update, not D (forward pass)|src/exec/pb.c|s{v->lr \* \(float\)st->D, st->n\);}{v->lr, st->n);}"
  "lwp: horizon D - 1 (folded into the update)|src/exec/pb.c|s{rule.pk = v->lr \* \(float\)st->D;}{rule.pk = v->lr * (float)(st->D - 1);}"
  "sc: off|src/optim/optim.c|s{r->sc = sc && delay > 0}{r->sc = 0 && delay > 0}"
  "sc: a = 1 instead of m^D|src/optim/optim.c|s{r->sc_a = \(float\)mD;}{r->sc_a = 1.0f;}"
  "sc: b without its 1 / (1 - m)|src/optim/optim.c|s{\(\(1\.0 - mD\) / \(1\.0 - \(double\)momentum\)\)}{(1.0 - mD)}"
  "sc: a = m^(D - 1)|src/optim/optim.c|s{pow\(\(double\)momentum, delay\)}{pow((double)momentum, delay - 1)}"
  "pipemare: no learning-rate warm-up|src/optim/optim.c|s{if \(delay <= 1 \|\| warmup <= 0\) return lr;}{return lr;}"
  "pipemare: warm-up exponent -(t / T) instead of -(1 - t / T)|src/optim/optim.c|s{-\(1\.0 - done\)}{-done}"
  "pipemare: no discrepancy correction (backward on w)|src/exec/pb.c|s{wb = st->wb;}{wb = w;}"
  "pipemare: delta not averaged (gamma ignored)|src/optim/optim.c|s{delta\[i\] = r\.gamma \* delta\[i\] \+ \(1\.0f - r\.gamma\) \* \(w\[i\] - old\);}{delta[i] = w[i] - old;}; s{delta\[i\] = gamma \* delta\[i\] \+ \(1\.0f - gamma\) \* \(wi - old\);}{delta[i] = wi - old;}"
  "sc: the vectorised update applies v, not a v + b d|src/optim/optim.c|s{kind == SC(\s+)\? a \* vi \+ b \* d}{kind == SC\$1? vi}"
  "pipemare: backward on w - delta, not w - D delta|src/exec/pb.c|s{st->delta, \(float\)st->D, st->n\);}{st->delta, 1.0f, st->n);}"
  "stash: the backward on the newest stashed version|src/exec/pb.c|s{wb = st->stash\[j % st->D\];}{wb = st->stash[(j + st->D - 1) % st->D];}"
  "stash: the backward on the live weights|src/exec/pb.c|s{wb = st->stash\[j % st->D\];}{wb = w;}"
  "delay: D(s) = 2 (S - 1 - s) + 1|src/exec/pb.c|s{st->D = 2 \* \(k - 1 - s\);}{st->D = 2 * (k - 1 - s) + 1;}"
  "momentum: v <- g (no heavy ball) in the PB rule|src/optim/optim.c|s{r->first_step = updates == 0;}{r->first_step = 1;}"
  "reference batch: the rule skipped|src/optim/optim.c|s#(void st_optim_scale_batch\([^{]*\{)#\$1 return;#"
  "reference batch: the trainer rescales to train.batch, not the micro-batch|src/exec/trainer.c|s{pb \? t->micro_batch : t->batch\);}{t->batch);}"
  "reference batch: the trainer never rescales|src/exec/trainer.c|s{if \(cfg->optimizer.reference_batch > 0\)}{if (0)}"
  "reference batch: momentum kept at the batch recipe's|src/optim/optim.c|s{double m_hat = m > 0 \? pow\(m, r\) : 0;}{double m_hat = m;}"
  "resume: the rules' count restarts at 0|src/exec/pb.c|s{p->stages\[s\]\.updates0 = done > 0 \? done : 0;}{p->stages[s].updates0 = 0 * done;}"
  "resume: the count forgets the D(s) updates in flight|src/exec/pb.c|s{int64_t done = v->step \* job->K - p->stages\[s\]\.D;}{int64_t done = v->step * job->K;}"
  "resume: pipemare's warm-up counts from the resume|src/exec/pb.c|s{st_pb_pipemare_lr\(v->lr, st->D, st->updates0 \+ st->updates,}{st_pb_pipemare_lr(v->lr, st->D, st->updates,}"
  "noise scale: B_s given as 2/3 of the micro-batch|src/exec/trainer.c|s{gs2, t->micro_batch, gb2, t->batch\);}{gs2, t->micro_batch * 2 / 3, gb2, t->batch);}"
  "noise scale: the first micro-batch's norm scaled once, not squared|src/runtime/step.c|s{\* scale \* scale;}{* scale;}"
  "noise scale: the batch's norm counted twice|src/exec/trainer.c|s{\*r->v->gb2 \+= st_sum_squares}{*r->v->gb2 += 2 * st_sum_squares}"
)

say() { printf 'mutate: %s\n' "$*"; }

rm -rf "$SCRATCH"
mkdir -p "$SCRATCH" || exit 2
git ls-files -z --cached --others --exclude-standard |
  while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
  xargs -0 cp --parents -t "$SCRATCH" || exit 2
# reuse this tree's objects: only what a mutation touches recompiles
if [ -d "$BUILD" ]; then cp -a "$BUILD" "$SCRATCH/$BUILD"; fi

bins=""
for t in $TESTS; do bins="$bins $BUILD/tests/$t"; done

build() { make -C "$SCRATCH" -s -j2 BUILD="$BUILD" $bins >"$SCRATCH/build.log" 2>&1; }

# 0: every test passed; 1: one failed
run_tests() {
  local t out
  for t in $TESTS; do
    out=$(cd "$SCRATCH" && STRATA_CALIBRATION=none STRATA_BUILD="$BUILD" \
      timeout 600 "$BUILD/tests/$t" 2>&1)
    local rc=$?
    if [ $rc -ne 0 ] || ! printf '%s\n' "$out" | tail -n 1 | grep -q ' 0 failed$'; then
      FAILED_IN=$t
      return 1
    fi
  done
  return 0
}

say "building the unmutated copy in $SCRATCH"
if ! build; then
  say "the unmutated tree does not build:"; tail -n 20 "$SCRATCH/build.log"; exit 2
fi
if ! run_tests; then
  say "the unmutated tree fails $FAILED_IN: fix that first"; exit 2
fi

caught=0 total=0 bad=0
for m in "${MUTATIONS[@]}"; do
  IFS='|' read -r name file subst <<<"$m"
  if [ -n "${MUTATE_ONLY:-}" ] && [ "$name" != "$MUTATE_ONLY" ]; then continue; fi
  total=$((total + 1))
  cp "$SCRATCH/$file" "$SCRATCH/$file.orig"
  perl -0pi -e "$subst" "$SCRATCH/$file"
  if cmp -s "$SCRATCH/$file" "$SCRATCH/$file.orig"; then
    printf '  %-72s NOT APPLIED (the code moved: update tools/mutate.sh)\n' "$name"
    bad=$((bad + 1))
  elif ! build; then
    printf '  %-72s DOES NOT BUILD\n' "$name"
    tail -n 5 "$SCRATCH/build.log" | sed 's/^/      /'
    bad=$((bad + 1))
  elif run_tests; then
    printf '  %-72s survived\n' "$name"
  else
    printf '  %-72s caught by %s\n' "$name" "$FAILED_IN"
    caught=$((caught + 1))
  fi
  mv "$SCRATCH/$file.orig" "$SCRATCH/$file"
  touch "$SCRATCH/$file"
done
build # leave the copy unmutated
echo "caught $caught of $total"
[ "$caught" -eq "$total" ] && [ "$bad" -eq 0 ]
