#!/usr/bin/env bash
# One short GPU lease, prepared in advance (the project gets ~15 device-minutes per session).
#
#   bash scripts/gpu_day.sh check OUT_DIR [BUDGET_SCALE]   # part 1: gpu_check.py + loop benchmark,
#                                                          #   ListOps (skyformer preset) generated meanwhile
#   bash scripts/gpu_day.sh listops OUT_DIR SECONDS KIND.. # part 2: ListOps at the Skyformer preset, each
#                                                          #   KIND trained for SECONDS, then tested
#   bash scripts/gpu_day.sh all OUT_DIR BUDGET_SCALE SECONDS KIND..   # both in one call (one machine start)
#   bash scripts/gpu_day.sh causal OUT_DIR [REPEATS]       # causal posrf-orf vs the
#                                                          #   official FAVOR+ at 1K-64K, B=1 H=2 and B=8 H=8,
#                                                          #   fwd and fwd+bwd (the B=8 H=8 16K fwd+bwd and
#                                                          #   64K cells do not fit the CPU machine;
#                                                          #   KF_CAUSAL_LENGTHS=128,256 for a CPU dry run)
#
# Part 2 trains the preset unchanged (50k-step schedule, evaluation every 500 steps), stops it with
# SIGINT after SECONDS (the trainer saves a checkpoint), then re-runs it with num_train_steps set to the
# step reached (allow_config_change), which does no more steps and tests the best-validation checkpoint
# on the whole test split. The result is therefore "the paper's schedule, truncated at step S" and
# results.json says S; it is not the paper's 50k-step number.
#
# Python packages the device image lacks travel as wheels in .whl/ (see docs/reproduce.md, "GPU day");
# the image's own jax/flax/optax/orbax are used and their versions printed first.
set -u
mode=${1:?usage: gpu_day.sh check|listops|all|causal OUT_DIR ...}
out=${2:?OUT_DIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
if [ -z "${KF_NO_WHL:-}" ] && [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl >/dev/null 2>&1 || { echo "wheel install failed"; exit 2; }
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
data=${KF_GPU_DATA:-$PWD/.gpudata}
cfg=${KF_GPU_CONFIG:-configs/listops.py:skyformer}

case "$mode" in
all)
  scale=${3:?BUDGET_SCALE}; secs=${4:?SECONDS}; shift 4
  bash "$0" check "$out" "$scale"
  bash "$0" listops "$out" "$secs" "$@"
  ;;
check)
  scale=${3:-0.4}
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 - <<'EOF'
import jax, flax, optax, orbax.checkpoint as ocp, numpy
print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__,
      'orbax', ocp.__version__ if hasattr(ocp, '__version__') else '?', 'numpy', numpy.__version__)
print(jax.devices())
EOF
  (python3 -m kernelformer prepare-data --config "$cfg" --data_dir "$data" \
     > /tmp/prepare.log 2>&1; echo "prepare rc $?" >> /tmp/prepare.log) &
  prep=$!
  timeout ${KF_CHECK_TIMEOUT:-420} python3 scripts/gpu_check.py --out_dir "$out" --budget_scale "$scale" 2>&1 \
    | tee "$out/gpu_check.log" | tail -n 60
  echo "gpu_check rc ${PIPESTATUS[0]}"
  cp kernelformer/pallas/validated.json "$out/validated.json" 2>/dev/null
  if python3 -m kernelformer benchmark --help 2>/dev/null | grep -q '\bloop\b'; then
    timeout ${KF_LOOP_TIMEOUT:-90} python3 -m kernelformer benchmark loop ${KF_LOOP_ARGS:-} 2>&1 | tail -n 30
  fi
  wait $prep
  tail -n 3 /tmp/prepare.log
  ;;
causal)
  # docs/benchmarks.md, "Causal: one scan over chunks vs the official FAVOR+": the same commands as the
  # CPU table, every cell, compiled memory limit lifted to the card's (the official B=8 H=8 64K
  # fwd+bwd is the largest program; cells over the limit are compiled and reported, not run).
  # B=8 H=8 first: its 16K fwd+bwd and 64K cells are the ones no CPU run has.
  reps=${3:-3}
  # The official B=8 H=8 64K fwd+bwd is ~49 GiB on CPU; let XLA have 90% of the card. A cell that
  # still runs out of memory is recorded as "failed: RESOURCE_EXHAUSTED ..." and the rest go on.
  export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.9}
  b=(python3 -m kernelformer benchmark attention --compare official --causal --num_features 256
     --lengths ${KF_CAUSAL_LENGTHS:-1024,4096,16384,65536} --repeats "$reps" --max_memory_gb ${KF_CAUSAL_MAX_GB:-60}
     --out_dir "$out")
  timeout ${KF_CAUSAL_TIMEOUT:-300} "${b[@]}" --batch 8 --heads 8 --name gpu_causal_b8h8 2>&1 | tail -n 12
  echo "causal b8h8 rc ${PIPESTATUS[0]}"
  timeout ${KF_CAUSAL_TIMEOUT:-200} "${b[@]}" --batch 1 --heads 2 --name gpu_causal_b1h2 2>&1 | tail -n 12
  echo "causal b1h2 rc ${PIPESTATUS[0]}"
  ;;
listops)
  secs=${3:?SECONDS}; shift 3
  python3 -m kernelformer prepare-data --config "$cfg" --data_dir "$data" 2>&1 | tail -n 2
  for kind in "$@"; do
    wd=/tmp/gpu_runs/$kind; mkdir -p /tmp/gpu_runs
    rm -rf "$wd"
    common=(--config "$cfg" --workdir "$wd" --config.data.data_dir="$data"
            --config.model.attention.kind="$kind" --config.progress=False)
    timeout -s INT "$secs" python3 -m kernelformer train "${common[@]}" > "/tmp/gpu_runs/$kind.log" 2>&1
    sleep 2
    step=$(ls "$wd/checkpoints" 2>/dev/null | grep -E '^[0-9]+$' | sort -n | tail -n 1)
    echo "$kind: stopped at step ${step:-none}"
    [ -n "$step" ] || { tail -n 20 "/tmp/gpu_runs/$kind.log"; continue; }
    timeout 120 python3 -m kernelformer train "${common[@]}" --config.num_train_steps="$step" \
      --config.allow_config_change=True >> "/tmp/gpu_runs/$kind.log" 2>&1
    grep -vE '^W[0-9]{4} ' "/tmp/gpu_runs/$kind.log" | tail -n 4
    cp "$wd/results.json" "$out/results-$kind.json" 2>/dev/null
    echo "$kind validation/test events:"
    grep -E '"split": "(val|test)"' "$wd/metrics.jsonl" | tail -n 20
  done
  ;;
*) echo "unknown mode $mode"; exit 2 ;;
esac
