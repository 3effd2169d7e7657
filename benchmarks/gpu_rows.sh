#!/usr/bin/env bash
# The GPU rows of docs/benchmarks.md, as one short script for a lent GPU machine: W0-W4 with the
# whole cohort in one vmap (chunk=all, the GPU setting) beside chunk=1, the reference loop of
# per-client jitted calls and (W0-W3) the PyTorch loop on the same GPU, one process per workload;
# then the cohort scan of W1 (10 ... 1000 clients a round) that places the crossover between
# chunk=1 and chunk=all. JSON lines (device and versions in each) go to $OUT/throughput_gpu.jsonl,
# each workload's Markdown table to $OUT/<workload>.md.
#
#   OUT=/some/dir bash benchmarks/gpu_rows.sh          # PER=seconds per workload (default 200)
#
# On an H200 W0-W3 took 40-80 s each and W4 about 150 s (its chunk=1 and reference rounds
# compile for 20-30 s each).
#
# Needs jax with CUDA, flax, optax, hydra-core, omegaconf, tensorboardX and (for the loop) torch.
set -u
out=${OUT:-$(pwd)/benchmarks/results}
per=${PER:-200}
mkdir -p "$out"
cd "$(dirname "$0")"
# Allocate on demand: torch shares the GPU in the same process, and the recorded peak is then
# what the run used, not XLA's preallocated pool.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -c "import jax; print(jax.devices())"
for w in W0 W4 W1 W2 W3; do
  torch=--torch
  [ "$w" = W4 ] && torch=
  timeout "$per" python3 throughput.py --workloads "$w" --chunks all,1,reference $torch \
    --repeats 5 --out "$out/throughput_gpu.jsonl" --markdown "$out/$w.md" \
    || echo "# $w: did not finish in ${per}s (exit $?)"
done
timeout "$per" python3 throughput.py --workloads W1 --scan cohort --chunks all,1 \
  --repeats 3 --out "$out/throughput_gpu.jsonl" --markdown "$out/scan_W1.md" \
  || echo "# W1 cohort scan: did not finish in ${per}s (exit $?)"
cat "$out"/*.md
