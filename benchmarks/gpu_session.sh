#!/usr/bin/env bash
# One prepared device check for issue 12 (GPU): run it once on a machine with a CUDA GPU.
#
# Here (a machine with pip access), once: fetch the pure-Python wheels the device image lacks
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps -d .whl gymnasium==1.4.0 stable-baselines3==2.9.2 farama-notifications==0.0.6
# There: `bash benchmarks/gpu_session.sh` (carry .whl; about 6-8 minutes on an H200). It writes its figures
# to ${OUT:-/tmp/gpu_session}/ and prints them.
# `bash benchmarks/gpu_session.sh table1 [SECONDS]` (issue 13; straight after, while the machine is warm) runs
# only the Table 1 reference runs CPU sessions cannot afford (V = 8, 16, 10 seeds, one seed batch per method and
# setting) for at most SECONDS (default 420); every finished seed is a record under $OUT/table1/runs/, to copy
# into runs/table1/runs/ here and report with `tpo-gym report runs/table1 --seeds 10`.
set -uo pipefail
OUT=${OUT:-/tmp/gpu_session}
mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD || exit 1
else
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
if [ "${1:-}" = table1 ]; then
  timeout "${2:-420}" python3 -c "import sys; from tpo_gym.evaluation.cli import main; sys.exit(main(sys.argv[1:]))" \
    bench --preset table1 --settings V=8,V=16 --setups reference --seeds 10 --seed-batch 10 --workers 1 \
    --device cuda --out "$OUT/table1" --no-progress 2>&1 | tee "$OUT/table1.txt"
  exit 0
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" | tee -a "$OUT/gpu.txt"

# 1. correctness on the device: on-device rollouts and the seed-stacked path agree with the CPU path
timeout 120 python3 - <<'PY' 2>&1 | tee "$OUT/check.txt"
import torch
from tpo_gym import TPO, GRPO, PPO, SeedBatch
TINY = {"d_model": 16, "d_ff": 32, "n_layers": 1}
for cls, kw in ((TPO, {"level": "token"}), (GRPO, {"level": "sequence"}), (PPO, {})):
    cpu = cls("TransformerPolicy", "tpo_gym/TokenReversal-v0", batch_size=16, group_size=4, seed=0,
              rollouts_on_device=True, policy_kwargs=TINY, **kw)
    cpu.learn(2 * cpu.steps_per_iteration)
    gpu = cls("TransformerPolicy", "tpo_gym/TokenReversal-v0", batch_size=16, group_size=4, seed=0, device="cuda",
              policy_kwargs=TINY, **kw)
    assert gpu._get_rollout_env().on_device, "CUDA default: on-device rollouts"
    gpu.learn(2 * gpu.steps_per_iteration)
    agents = [cls("TransformerPolicy", "tpo_gym/TokenReversal-v0", batch_size=16, group_size=4, seed=s,
                  device="cuda", policy_kwargs=TINY, **kw) for s in range(4)]
    batch = SeedBatch(agents)
    batch.learn(2 * agents[0].steps_per_iteration)
    print(cls.__name__, "modes", batch.forward, batch.optimizer, batch.rollout,
          "| first error cpu / cuda / stacked seed 0:", cpu.history[0]["error"], gpu.history[0]["error"],
          agents[0].history[0]["error"], "| last:", cpu.history[-1]["error"], gpu.history[-1]["error"],
          agents[0].history[-1]["error"])
PY

# 2. the benchmark of the issue: S = 1, 20, 100 at the Table 1 setting
timeout 420 python3 benchmarks/bench_seed_batch.py --device cuda --sizes 1,20,100 --iterations 3 2>&1 | tee "$OUT/bench.txt"
