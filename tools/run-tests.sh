#!/usr/bin/env bash
# Runs every test program (build/tests/*/test_*) and shell test
# (tests/*/test_*.sh), adds up their "N passed, N failed" lines and prints the
# total as the closing line. A program that crashes or prints no closing line
# counts as one failure. Usage: tools/run-tests.sh BUILD_DIR
set -u
build=${1:-build}
export STRATA_BUILD=$build
# Hermetic: no test sees the user's calibration profile (~/.cache/strata),
# whose presence changed the plans, and so the checks, of the pipeline tests;
# a test that wants a profile names its own.
export STRATA_CALIBRATION=none
cd "$(dirname "$0")/.."
total_pass=0; total_fail=0; failed_names=""
run_one() {
  local name=$1; shift
  local log; log=$(mktemp)
  local start=$SECONDS
  "$@" >"$log" 2>&1
  local rc=$?
  local line; line=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$log" | tail -n 1)
  local p=0 f=0
  if [ -n "$line" ]; then
    p=${line%% passed*}; f=${line#*, }; f=${f%% failed*}
  fi
  if [ -z "$line" ] || [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=$((f + 1)); fi
  total_pass=$((total_pass + p)); total_fail=$((total_fail + f))
  if [ "$f" -ne 0 ]; then
    failed_names="$failed_names $name"
    printf '%-36s %4d passed, %d failed  (%ds) rc=%d\n' "$name" "$p" "$f" $((SECONDS - start)) "$rc"
    sed 's/^/    | /' "$log" | tail -n 40
  else
    printf '%-36s %4d passed  (%ds)\n' "$name" "$p" $((SECONDS - start))
  fi
  rm -f "$log"
}
for t in $(find "$build/tests" -type f -name 'test_*' -perm -u+x | sort); do
  run_one "${t#$build/tests/}" "$t"
done
for t in $(find tests -name 'test_*.sh' | sort); do
  run_one "${t#tests/}" bash "$t"
done
[ -n "$failed_names" ] && echo "failed:$failed_names"
echo "$total_pass passed, $total_fail failed"
[ "$total_fail" -eq 0 ]
