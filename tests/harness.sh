# harness.sh — sourced by the shell tests (tests/*/test_*.sh): the strata
# binary under test ($STRATA_BUILD/strata, set by tools/run-tests.sh), a
# scratch folder $T removed on exit, pass/fail counters with the closing
# line "N passed, N failed" (finish), and run, which leaves a command's
# status, stdout and stderr in rc, out and err.
set -u

strata="${STRATA_BUILD:-build}/strata"
# no calibration profile unless a test names one (tools/run-tests.sh sets
# the same): a developer's ~/.cache profile would change kernels and plans
export STRATA_CALIBRATION="${STRATA_CALIBRATION:-none}"
passed=0
failed=0

T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

pass() { passed=$((passed + 1)); }
fail() {
  failed=$((failed + 1))
  printf 'FAIL %s\n' "$1"
  shift
  for detail in "$@"; do printf '    %s\n' "$detail"; done
}

finish() {
  echo "$passed passed, $failed failed"
  [ "$failed" -eq 0 ] && exit 0
  exit 1
}

if [ ! -x "$strata" ]; then
  fail "binary" "$strata is missing or not executable; run make first"
  finish
fi

# re_quote TEXT: a regular expression matching TEXT literally (paths hold
# dots and slashes).
re_quote() { printf '%s' "$1" | sed 's/[][\.*^$+?(){}|/]/\\&/g'; }

# run CMD...: runs strata with CMD, leaving rc, out (stdout) and err (stderr).
run() {
  "$strata" "$@" >"$T/stdout" 2>"$T/stderr"
  rc=$?
  out=$(cat "$T/stdout")
  err=$(cat "$T/stderr")
}
