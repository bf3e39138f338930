#!/usr/bin/env bash
# The prepared GPU command (issue 28): one call on a machine with a CUDA GPU, finishing within SECONDS.
#
# Before the window, here (pip access), once: the pure-Python wheels the bare GPU machine lacks
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps -d .whl gymnasium==1.4.0 stable-baselines3==2.9.2 farama-notifications==0.0.6
# In the window (carry .whl; timeout_s a little over SECONDS, at most 600):
#   bash benchmarks/gpu_session.sh 560
# and, if the window has minutes left, a second call that only continues the queue:
#   GPU_STEPS=queue bash benchmarks/gpu_session.sh 200
#
# Steps, in order, each within what is left of SECONDS:
#   checks  CUDA against the CPU on tiny configurations of every agent family (benchmarks/gpu_checks.py: token,
#           sequence, single, MNIST, SeedBatch loop and stacked): the same first iterations to float tolerance.
#           A failed check skips the queue (its records would be suspect).
#   bench   benchmarks/bench_seed_batch.py --device cuda at S = 1, 20, 100, with its per-phase profile.
#   queue   benchmarks/gpu_queue.py run: the preset chunks of its QUEUE in order of value, each a `tpo-gym bench
#           ... --device cuda --seed-batch S` under `timeout`, until the deadline (SECONDS less what the steps
#           before took, less GPU_MARGIN for packing); committed runs (benchmarks/results/<preset>/runs/) are
#           skipped, so each window continues where the last one stopped. Every new run record is packed into
#           $OUT/runs-N.tar.gz (each under 16 MiB), with a summary of the chunks in $OUT/queue.txt.
# What comes back ($OUT, at most 8 files): session.log, gpu.txt, checks.txt, bench.txt, queue.txt, runs-N.tar.gz.
#
# After the window, here:
#   python benchmarks/gpu_queue.py unpack <files_at>/runs-*.tar.gz   # ok records -> benchmarks/results/<preset>/runs/
#   tpo-gym report benchmarks/results/<preset> --seeds N            # per preset; --settings A,B to widen
#   then update benchmarks/results/README.md (each new number beside the paper's, the claims under both setups,
#   the GPU figures of checks.txt and bench.txt) and commit the records and the reports.
#
# Settings (environment variables):
#   OUT                where the results go (default /tmp/gpu_session; the device tool sets it)
#   GPU_DEVICE         torch device (default cuda; cpu in the dry run, tests/evaluation/test_gpu_session.py)
#   GPU_STEPS          the steps to run, comma-separated (default checks,bench,queue)
#   GPU_QUEUE          a queue file, lines "PRESET tpo-gym-bench-arguments" (default: QUEUE of benchmarks/gpu_queue.py)
#   GPU_RESULTS        the committed results whose runs are skipped (default benchmarks/results)
#   GPU_WORK           the chunks' bench folders (default /tmp/gpu_work)
#   GPU_MARGIN         seconds kept for packing (default 45)
#   GPU_BENCH_METHODS  methods of the bench step (default TPO_token; all three: TPO_token,GRPO_token,PPO)
#   PYTHON             the interpreter (default python3)
set -uo pipefail
cd "$(dirname "$0")/.."
TOTAL=${1:-560}
OUT=${OUT:-/tmp/gpu_session}
DEVICE=${GPU_DEVICE:-cuda}
STEPS=${GPU_STEPS:-checks,bench,queue}
PYTHON=${PYTHON:-python3}
export PYTHONUNBUFFERED=1

left() { echo $((TOTAL - SECONDS)); }
capped() { local l; l=$(left); echo $(( l < $1 ? l : $1 )); }  # seconds for a step: its cap, or what is left
wants() { [[ ",$STEPS," == *",$1,"* ]] && [ "$(left)" -ge 10 ]; }

session() {
  if [ -d .whl ]; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      .whl/*.whl || { echo "installing the carried wheels failed"; return 1; }
    export PYTHONPATH=/tmp/site:$PWD
  else
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
  fi
  if [[ $DEVICE == cuda* ]]; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
  fi
  "$PYTHON" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" | tee -a "$OUT/gpu.txt"

  local status=0
  if wants checks; then
    echo "== checks: $DEVICE against the CPU ($(left) s left)"
    timeout "$(capped 150)" "$PYTHON" benchmarks/gpu_checks.py --device "$DEVICE" | tee "$OUT/checks.txt"
    status=$?
    [ $status -eq 0 ] || echo "== the checks failed (exit status $status): the queue is skipped"
  fi
  if wants bench; then
    echo "== bench: seed batches on $DEVICE ($(left) s left)"
    timeout "$(capped 180)" "$PYTHON" benchmarks/bench_seed_batch.py --device "$DEVICE" --sizes 1,20,100 \
      --iterations 3 --methods "${GPU_BENCH_METHODS:-TPO_token}" | tee "$OUT/bench.txt"
  fi
  if [ $status -eq 0 ] && wants queue; then
    echo "== queue ($(left) s left)"
    "$PYTHON" benchmarks/gpu_queue.py run --seconds "$(left)" --device "$DEVICE" --out "$OUT" \
      --work "${GPU_WORK:-/tmp/gpu_work}" --margin "${GPU_MARGIN:-45}" \
      ${GPU_RESULTS:+--results "$GPU_RESULTS"} ${GPU_QUEUE:+--queue "$GPU_QUEUE"}
    status=$?
  fi
  echo "== done in $SECONDS s (exit status $status)"
  return $status
}

mkdir -p "$OUT"
session 2>&1 | tee -a "$OUT/session.log"
exit "${PIPESTATUS[0]}"
