#!/usr/bin/env bash
# The GPU rows of docs/benchmarks.md, as one short script for a lent GPU machine:
#   rows      W0-W4 with the whole cohort in one vmap (chunk=all, the GPU setting) beside chunk=1,
#             the reference loop of per-client jitted calls and (W0-W3) the PyTorch loop on the
#             same GPU, one process per workload;
#   scan      the cohort scan of W1 (10 ... 1000 clients a round): chunk=1 against chunk=all;
#   replicas  seeds 0-3 as one program (replica_chunk=1 and all) against the four seeds one
#             after another, for W3, W1 and W0 at client chunk=all and 1;
#   sweeps    4 lr x 3 seeds of W3 (30 rounds) through hydra/launcher=vectorized, the basic
#             launcher and joblib (benchmarks/sweeps.py, issue 38's >= 5x target), JSON lines to
#             $OUT/sweeps_gpu.jsonl (not part of the default STAGES: it runs the CLI, ~3 minutes).
# JSON lines (device and versions in each) go to $OUT/throughput_gpu.jsonl, each workload's
# Markdown table to $OUT/<workload>.md.
#
#   OUT=/some/dir bash benchmarks/gpu_rows.sh          # all stages, all workloads
#   STAGES="replicas rows" WORKLOADS="W4 W0" PER=150 OUT=... bash benchmarks/gpu_rows.sh
#
# PER: seconds per workload and stage (default 200). On an H200 the rows of W0-W3 took 40-80 s
# each; W4 needs about 200 s: each of its mappings compiles its first round (20-40 s) and its
# first helper-refresh round (15-25 s); on an H100, PER=150 ended it before the reference loop.
# On the H100, STAGES="replicas rows" WORKLOADS="W4 W0" PER=150 ran 399 s in all (W4 cut at 150 s).
#
# Needs jax with CUDA, flax, optax, hydra-core, omegaconf, tensorboardX and (for the loop) torch,
# and fedjax_semi importable (PYTHONPATH=src).
set -u
out=${OUT:-$(pwd)/benchmarks/results}
per=${PER:-200}
stages=${STAGES:-rows scan replicas}
workloads=${WORKLOADS:-W0 W4 W1 W2 W3}
for stage in $stages; do
  case $stage in rows|scan|replicas|sweeps) ;;
    *) echo "gpu_rows.sh: STAGES has '$stage'; allowed: rows, scan, replicas, sweeps" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
cd "$(dirname "$0")"
# Allocate on demand: torch shares the GPU in the same process, and the recorded peak is then
# what the run used, not XLA's preallocated pool.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
python3 -c "import jax; print(jax.devices())"
for stage in $stages; do
  case $stage in
    rows)
      for w in $workloads; do
        torch=--torch
        [ "$w" = W4 ] && torch=
        timeout "$per" python3 throughput.py --workloads "$w" --chunks all,1,reference $torch \
          --repeats 5 --out "$out/throughput_gpu.jsonl" --markdown "$out/$w.md" \
          || echo "# $w: did not finish in ${per}s (exit $?)"
      done ;;
    scan)
      timeout "$per" python3 throughput.py --workloads W1 --scan cohort --chunks all,1 \
        --repeats 3 --out "$out/throughput_gpu.jsonl" --markdown "$out/scan_W1.md" \
        || echo "# W1 cohort scan: did not finish in ${per}s (exit $?)" ;;
    replicas)
      for w in W3 W1 W0; do
        timeout "$per" python3 throughput.py --workloads "$w" --replicas 4 --chunks all,1 \
          --replica-chunks 1,all --repeats 5 --out "$out/throughput_gpu.jsonl" \
          || echo "# $w replicas: did not finish in ${per}s (exit $?)"
      done ;;
    sweeps)
      timeout "$per" python3 sweeps.py --workloads W3 --rounds W3=30 \
        --launchers vectorized,basic,joblib --hardware gpu --out "$out/sweeps_gpu.jsonl" \
        || echo "# W3 sweeps: did not finish in ${per}s (exit $?)" ;;
  esac
done
cat "$out"/*.md 2>/dev/null
