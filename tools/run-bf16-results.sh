#!/usr/bin/env bash
# Regenerates docs/results/bf16.md: train.precision bf16 against fp32 on the
# same data, seeds and recipe — FC-MNIST and the CNN on Fashion-MNIST (test
# accuracy), gpt_tiny on the fortunes corpus (validation loss) — SEEDS seeds
# each, every run on one thread, JOBS runs at once. The runs stay in
# runs/bf16-*.
#
# Usage: tools/run-bf16-results.sh [STRATA_BINARY]   (`make` first)
# Environment: SEEDS (default 3), JOBS (default every core),
#              REUSE=1 keeps a run whose summary.json exists.
set -eu
bin=${1:-build/strata}
cd "$(dirname "$0")/.." || exit 1
seeds=${SEEDS:-3}
jobs=${JOBS:-$(nproc)}
out=docs/results/bf16.md
mkdir -p docs/results runs

list=()
for cfg in fc_mnist cnn_fmnist gpt_tiny; do
  for s in $(seq 42 $((41 + seeds))); do
    for p in fp32 bf16; do list+=("$cfg $s $p"); done
  done
done

run_one() {
  local cfg=$1 seed=$2 prec=$3 dir=runs/bf16-$1-$2-$3
  if [ "${REUSE:-0}" = 1 ] && [ -f "$dir/summary.json" ]; then return; fi
  "$bin" train "configs/$cfg.yaml" --set train.seed="$seed" \
    --set train.precision="$prec" --set train.threads=1 \
    --out "$dir" --overwrite >"$dir.log" 2>&1 ||
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
    for s in $(seq 42 $((41 + seeds))); do
      a=runs/bf16-$cfg-$s-fp32 b=runs/bf16-$cfg-$s-bf16
      awk -v c="$cfg" -v k="$key" -v s="$s" -v x="$(field $a $key)" \
        -v y="$(field $b $key)" -v rx="$(field $a samples_per_s)" \
        -v ry="$(field $b samples_per_s)" 'BEGIN {
          if (k == "test_accuracy")
            printf "| %s | accuracy %% | %s | %.2f | %.2f | %+.2f points | %.0f | %.0f |\n",
              c, s, 100 * x, 100 * y, 100 * (y - x), rx, ry
          else
            printf "| %s | validation loss | %s | %.4f | %.4f | %+.2f%% | %.0f | %.0f |\n",
              c, s, x, y, 100 * (y - x) / x, rx, ry }'
    done
  done
  echo
  echo "The rates are of runs sharing the machine JOBS at a time: compare"
  echo "them within a row only, and see \`make bench\` for speed."
} >"$out"
echo "run-bf16-results: wrote $out"
