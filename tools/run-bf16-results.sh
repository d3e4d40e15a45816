#!/usr/bin/env bash
# Regenerates docs/results/bf16.md: train.precision bf16 against fp32 on the
# same data, seeds and recipe — FC-MNIST and the CNN on Fashion-MNIST (test
# accuracy), gpt_tiny on the fortunes corpus (validation loss) — SEEDS seeds
# each (gpt_tiny GPT_SEEDS), every run on one thread, JOBS runs at once.
# gpt_tiny also runs in fp32 as two replicas (the same batch, its gradient
# summed in another order): a change of rounding only, to show how far
# rounding alone moves its loss. The runs stay in runs/bf16-*.
#
# Usage: tools/run-bf16-results.sh [STRATA_BINARY]   (`make` first)
# Environment: SEEDS (default 3), GPT_SEEDS (default 5), JOBS (default
#              every core), REUSE=1 keeps a run whose summary.json exists.
set -eu
bin=${1:-build/strata}
cd "$(dirname "$0")/.." || exit 1
seeds=${SEEDS:-3}
gpt_seeds=${GPT_SEEDS:-5}
jobs=${JOBS:-$(nproc)}
out=docs/results/bf16.md
mkdir -p docs/results runs

seeds_of() { [ "$1" = gpt_tiny ] && seq 42 $((41 + gpt_seeds)) || seq 42 $((41 + seeds)); }
list=()
for cfg in fc_mnist cnn_fmnist gpt_tiny; do
  for s in $(seeds_of $cfg); do
    for p in fp32 bf16; do list+=("$cfg $s $p"); done
    [ "$cfg" = gpt_tiny ] && list+=("$cfg $s fp32r2")
  done
done

run_one() { # fp32r2: fp32 as two replicas
  local cfg=$1 seed=$2 prec=$3 dir=runs/bf16-$1-$2-$3 rep=1
  if [ "${REUSE:-0}" = 1 ] && [ -f "$dir/summary.json" ]; then return; fi
  [ "$prec" = fp32r2 ] && prec=fp32 rep=2
  "$bin" train "configs/$cfg.yaml" --set train.seed="$seed" \
    --set train.precision="$prec" --set execution.replicas=$rep \
    --set train.threads=$rep --out "$dir" --overwrite >"$dir.log" 2>&1 ||
    { echo "run-bf16-results: $dir failed (see $dir.log)" >&2; return 1; }
}
export -f run_one
export bin REUSE
printf '%s\n' "${list[@]}" | xargs -P "$jobs" -L 1 bash -c 'run_one $0 $1 $2'

field() { # field DIR KEY: a number from DIR/summary.json
  sed -n "s/^  \"$2\": \\([-0-9.e]*\\),\$/\\1/p" "$1/summary.json"
}
{
  echo "# bf16 mixed precision against fp32"
  echo
  echo "Made by \`tools/run-bf16-results.sh\` on $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')"
  echo "($(nproc) vCPUs), $(date -u +%Y-%m-%d). Products: $(sed -n 's/^  "precision": "bf16: \(.*\)",$/\1/p' runs/bf16-fc_mnist-42-bf16/summary.json)."
  echo "Each run on one thread; the same seed gives both precisions the same"
  echo "initial weights and batches. Accuracy is on the test set (10,000"
  echo "images); gpt_tiny's loss is on its held-out tenth of the corpus."
  echo
  echo "| config | metric | seed | fp32 | bf16 | bf16 − fp32 | samples/s fp32 | samples/s bf16 |"
  echo "|---|---|---|---|---|---|---|---|"
  for cfg in fc_mnist cnn_fmnist gpt_tiny; do
    key=test_accuracy
    [ "$cfg" = gpt_tiny ] && key=test_loss
    for s in $(seeds_of $cfg); do
      a=runs/bf16-$cfg-$s-fp32 b=runs/bf16-$cfg-$s-bf16
      echo "$cfg $key $s $(field $a $key) $(field $b $key) $(field $a samples_per_s) $(field $b samples_per_s)"
    done
  done | awk '
    function row(c, k, s, x, y, rx, ry) {
      if (k == "test_accuracy")
        printf "| %s | accuracy %% | %s | %.2f | %.2f | %+.2f points | %s | %s |\n",
          c, s, 100 * x, 100 * y, 100 * (y - x), rx, ry
      else
        printf "| %s | validation loss | %s | %.4f | %.4f | %+.2f%% | %s | %s |\n",
          c, s, x, y, 100 * (y - x) / x, rx, ry
    }
    { if ($1 != c && n) { row(c, k, "mean", sx / n, sy / n, "", ""); sx = sy = n = 0 }
      c = $1; k = $2; row($1, $2, $3, $4, $5, sprintf("%.0f", $6), sprintf("%.0f", $7))
      sx += $4; sy += $5; n++ }
    END { if (n) row(c, k, "mean", sx / n, sy / n, "", "") }'
  echo
  echo "gpt_tiny's loss moves by a few per cent with rounding alone. The same"
  echo "fp32 training as two replicas (the batch's gradient summed in another"
  echo "order, each sum within fp32 rounding of the other) against one:"
  echo
  echo "| seed | fp32 | fp32, 2 replicas | difference | bf16 − fp32 |"
  echo "|---|---|---|---|---|"
  for s in $(seeds_of gpt_tiny); do
    awk -v s="$s" -v x="$(field runs/bf16-gpt_tiny-$s-fp32 test_loss)" \
      -v r="$(field runs/bf16-gpt_tiny-$s-fp32r2 test_loss)" \
      -v y="$(field runs/bf16-gpt_tiny-$s-bf16 test_loss)" 'BEGIN {
        printf "| %s | %.4f | %.4f | %+.2f%% | %+.2f%% |\n", s, x, r,
          100 * (r - x) / x, 100 * (y - x) / x }'
  done
  echo
  echo "The rates are of runs sharing the machine JOBS at a time: compare"
  echo "them within a row only, and see \`make bench\` for speed."
} >"$out"
echo "run-bf16-results: wrote $out"
