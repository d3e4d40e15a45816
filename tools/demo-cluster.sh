#!/usr/bin/env bash
# make demo-cluster: a model whose weights and optimizer state exceed what
# each rank may hold (configs/cluster_demo.yaml sets execution.rank_memory_limit
# to 300 MB; the MLP needs 362 MB for weights, gradients and AdamW state),
# trained on this machine with mpirun:
#   0. in one process: refused at start, naming the shortfall;
#   (a) a pipeline over 2 ranks (execution.placement: ranks), each rank
#       holding only its own stages;
#   (b) weight streaming over 3 ranks: rank 0 the store (a file store: the
#       weights and AdamW state on disk) and the optimizer, ranks 1 and 2
#       computing data-parallel with only the blocks in flight.
# Each run prints every rank's planned and peak memory (counted, and
# resident: VmHWM) and the bytes it sent and received per step. On a real
# cluster the same commands run with a hostfile (README: "On a cluster").
set -u
strata=${1:-build}/strata
config=configs/cluster_demo.yaml
out=runs/demo-cluster
# root may run Open MPI here (a demo machine); more ranks than cores too
mpi=(mpirun --oversubscribe)
[ "$(id -u)" -eq 0 ] && mpi+=(--allow-run-as-root)
rm -rf "$out"
mkdir -p "$out"
# show NAME: the lines of a run's output that say what happened
show() { grep -E '^strata: (error|rank|done|weight streaming over|[0-9]+ MPI ranks)' "$1" | sed 's/^/  /'; }

echo "== 0. one process, execution.rank_memory_limit 300 MB: refused at start"
"$strata" train "$config" --out "$out/one" >"$out/one.log" 2>&1
show "$out/one.log"

echo
echo "== (a) a pipeline over 2 ranks, each holding its own stages"
"${mpi[@]}" -np 2 "$strata" train "$config" --set execution.placement=ranks \
  --out "$out/pipeline" >"$out/pipeline.log" 2>&1 || { cat "$out/pipeline.log"; exit 1; }
show "$out/pipeline.log"

echo
echo "== (b) weight streaming: a store rank (file store) and 2 compute ranks"
"${mpi[@]}" -np 3 "$strata" train "$config" --set execution.mode=weight_streaming \
  --set execution.store=file --set execution.micro_batch=0 \
  --out "$out/streaming" >"$out/streaming.log" 2>&1 || { cat "$out/streaming.log"; exit 1; }
show "$out/streaming.log"
echo
echo "(full logs and each run's summary.json, with every rank's figures, in $out)"
