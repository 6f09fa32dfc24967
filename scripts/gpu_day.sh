#!/usr/bin/env bash
# One short GPU lease, prepared in advance (the project gets ~15 device-minutes per session).
#
#   bash scripts/gpu_day.sh check OUT_DIR [BUDGET_SCALE]   # part 1: gpu_check.py + loop benchmark,
#                                                          #   ListOps (skyformer preset) generated meanwhile
#   bash scripts/gpu_day.sh listops OUT_DIR SECONDS KIND.. # part 2: ListOps at the Skyformer preset, each
#                                                          #   KIND trained for SECONDS, then tested
#   bash scripts/gpu_day.sh all OUT_DIR BUDGET_SCALE SECONDS KIND..   # both in one call (one machine start)
#   bash scripts/gpu_day.sh reproduce OUT_DIR              # first on any lent GPU (<= 9 device-minutes):
#                                                          #   Skyformer table 1 ListOps for performer-skyformer
#                                                          #   and skyformer CONCURRENTLY on the one GPU, the full
#                                                          #   50k-step schedule; Zoology figure 2's attention
#                                                          #   point (64 / 4 pairs, d 64, 4 lrs) meanwhile;
#                                                          #   OUT_DIR/results.{json,md}. KF_REPRODUCE_DRY=1: a
#                                                          #   CPU dry run at tiny sizes (the test suite's);
#                                                          #   KF_REPRODUCE_INSTABILITY=1 adds Skyformer table
#                                                          #   3's ListOps column beside the ListOps pair
#   bash scripts/gpu_day.sh reproduce-continue OUT_DIR     # the next call: the runs reproduce's time
#                                                          #   limit stopped continue toward their
#                                                          #   schedule; the table again, over every run
#                                                          #   of both calls. On the warm machine as it
#                                                          #   stands; on a fresh one from the last call's
#                                                          #   OUT/continue-*.tar.gz (KF_REPRODUCE_FROM=DIR,
#                                                          #   a folder carried in the working tree)
#   bash scripts/gpu_day.sh record OUT_DIR                 # the record (OUT/results.*, continue-*.tar.gz)
#                                                          #   of the runs as they stand, for a call that
#                                                          #   was cut off before writing its own
#   bash scripts/gpu_day.sh causal OUT_DIR [REPEATS]       # causal posrf-orf vs the
#                                                          #   official FAVOR+ at 1K-64K, B=1 H=2 and B=8 H=8,
#                                                          #   fwd and fwd+bwd (the B=8 H=8 16K fwd+bwd and
#                                                          #   64K cells do not fit the CPU machine;
#                                                          #   KF_CAUSAL_LENGTHS=128,256 for a CPU dry run)
#
# The device returns at most 8 files of <= 16 MiB from its $OUT, so write OUT_DIR elsewhere and bring
# back the table, the stopped runs and the rest packed:
#   bash scripts/gpu_day.sh reproduce /tmp/o; cp /tmp/o/results.json /tmp/o/results.md /tmp/o/continue-*.tar.gz $OUT/
#   tar -czf $OUT/record.tar.gz -C /tmp/o --exclude='continue-*' .
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
mode=${1:?usage: gpu_day.sh check|listops|all|reproduce|reproduce-continue|record|causal OUT_DIR ...}
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
# Outside the repository: a warm machine keeps /tmp between calls, while the repository copy is refreshed
# (a second call would generate the data again).
data=${KF_GPU_DATA:-/tmp/kf_gpudata}
cfg=${KF_GPU_CONFIG:-configs/listops.py:skyformer}

# The reproduce modes' common tail, on the globals py, runs, out, table (--run ROW=WD ...), cmds, skipped.
# test_where_stopped: every run whose newest checkpoint is past its results.json (stopped by its time
# limit: SIGINT saves a checkpoint) is re-run with num_train_steps = that step (allow_config_change),
# which trains no further and tests the best-validation checkpoint there; side by side, a tenth of the
# card each. Its row then says "truncated", never a full-schedule number.
test_where_stopped() {
  local pids=() what=() arg wd step tested rerun i
  for arg in "${table[@]}"; do
    [ "$arg" = --run ] && continue
    wd=${arg#*=}
    step=$(ls "$wd/checkpoints" 2>/dev/null | grep -E '^[0-9]+$' | sort -n | tail -n 1)
    if [ -z "$step" ]; then echo "$wd: no checkpoint"; tail -n 5 "$wd.log"; continue; fi
    tested=$($py -c "import json, sys; print(json.load(open(sys.argv[1]))['final_step'])" \
             "$wd/results.json" 2>/dev/null || echo -1)
    [ "$tested" -ge "$step" ] && continue
    mapfile -t rerun < "$wd.cmd"
    rerun+=(--config.num_train_steps="$step" --config.allow_config_change=True)
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.1 timeout -k 10 "${KF_REPRODUCE_TEST_SECONDS:-120}" $py "${rerun[@]}" >> "$wd.log" 2>&1 &
    pids+=($!); what+=("$wd stopped at step $step, tested there")
    cmds+=("python3 ${rerun[*]}")
  done
  for i in "${!pids[@]}"; do wait "${pids[$i]}"; echo "${what[$i]} (rc $?)"; done
}
# run_status WD: gpu_table's status of one run (finished, truncated, no results.json ...).
run_status() {
  $py -c "import sys; from kernelformer.reproduce import gpu_table; print(gpu_table.row('', '', sys.argv[1])['status'])" "$1"
}
# load_runs: table, cmds and skipped of the runs in $runs (what reproduce left for a next call); exit 2
# with one line when there are none.
load_runs() {
  if [ ! -f "$runs/table.args" ]; then
    echo "$mode: $runs holds no runs of a reproduce call (this machine was not the last call's, or it was given back: KF_REPRODUCE_FROM=a folder with that call's OUT/continue-*.tar.gz); run reproduce first"
    exit 2
  fi
  mapfile -t table < "$runs/table.args"
  mapfile -t cmds < "$runs/commands.txt"
  skipped=(); [ -s "$runs/skipped.txt" ] && mapfile -t skipped < "$runs/skipped.txt"
}
# pack_runs: OUT/continue-<run>.tar.gz, one for every truncated run: what reproduce-continue needs to
# continue it on another machine (this one given back, or its lease over): the run's whole workdir
# (checkpoints, best checkpoints, metrics, records; its lock and TensorBoard files left out) and
# command, and the call's table and commands with every run's results.json. One file a run, since the
# device returns files of at most 16 MiB: a ListOps run at the skyformer preset (206k parameters,
# 2 + 2 checkpoints of parameters and Adam moments) is ~9 MB.
pack_runs() {
  local arg wd n r common=(table.args runs_dir.txt) truncated=()
  rm -f "$out"/continue-*.tar.gz
  for n in commands.txt skipped.txt; do [ -f "$runs/$n" ] && common+=("$n"); done
  for arg in "${table[@]}"; do
    [ "$arg" = --run ] && continue
    wd=${arg#*=}; n=$(basename "$wd")
    [ "$(dirname "$wd")" = "$runs" ] || continue
    if [ "$(run_status "$wd")" = truncated ]; then truncated+=("$n")
    elif [ -f "$wd/results.json" ]; then common+=("$n/results.json"); fi
  done
  [ ${#truncated[@]} -gt 0 ] || return 0
  printf '%s\n' "$runs" > "$runs/runs_dir.txt"
  for r in "${truncated[@]}"; do
    if tar -czf "$out/continue-$r.tar.gz" -C "$runs" --exclude=lock --exclude=tensorboard \
         "${common[@]}" "$r.cmd" "$r"; then
      echo "$mode: $r packed to $out/continue-$r.tar.gz ($(du -k "$out/continue-$r.tar.gz" | cut -f1) KiB)"
    else
      echo "$mode: packing $r failed"; rm -f "$out/continue-$r.tar.gz"
    fi
  done
  echo "$mode: on a fresh machine, KF_REPRODUCE_FROM=<a folder holding the continue-*.tar.gz> bash scripts/gpu_day.sh reproduce-continue OUT"
}
# unpack_runs FROM: the continue-*.tar.gz in the folder FROM (or the one file FROM) into $runs (their
# paths rewritten when they were packed elsewhere), and the data each run reads prepared again (the
# generation is seeded: the same files; the trainer's data fingerprint check refuses a resume on
# other data).
unpack_runs() {
  local from=$1 c file files=() prepared=()
  if [ -d "$from" ]; then files=("$from"/continue-*.tar.gz); [ -f "${files[0]}" ] || files=()
  elif [ -f "$from" ]; then files=("$from"); fi
  [ ${#files[@]} -gt 0 ] || { echo "$mode: KF_REPRODUCE_FROM=$from: no continue-*.tar.gz there"; exit 2; }
  mkdir -p "$runs"
  for file in "${files[@]}"; do
    tar -xzf "$file" -C "$runs" table.args >/dev/null 2>&1 \
      || { echo "$mode: $file is not a continue-*.tar.gz of gpu_day.sh reproduce"; exit 2; }
    tar -xzf "$file" -C "$runs" || { echo "$mode: $file: unpacking failed"; exit 2; }
  done
  $py - "$runs" <<'PYEOF' || exit 2
import glob, os, sys
runs = sys.argv[1]
old = open(os.path.join(runs, 'runs_dir.txt')).read().strip()
if old != runs:   # packed under another directory: its paths, as whole path components
  for path in [os.path.join(runs, 'table.args')] + glob.glob(os.path.join(runs, '*.cmd')):
    text = open(path).read().replace(old + '/', runs + '/')
    open(path, 'w').write(text)
PYEOF
  for c in "$runs"/*.cmd; do
    [ -d "${c%.cmd}/checkpoints" ] || continue
    mapfile -t prep < <($py - "$c" <<'PYEOF'
import sys
args = open(sys.argv[1]).read().split('\n')
cfg = args[args.index('--config') + 1] if '--config' in args else ''
data = [a.split('=', 1)[1] for a in args if a.startswith('--config.data.data_dir=')]
if cfg and data:
  print('-m\nkernelformer\nprepare-data\n--config\n' + cfg + '\n--data_dir\n' + data[-1])
PYEOF
)
    [ ${#prep[@]} -gt 0 ] || continue
    [[ " ${prepared[*]-} " == *" ${prep[*]} "* ]] && continue    # runs on the same data: once
    prepared+=("${prep[*]}")
    $py "${prep[@]}" 2>&1 | tail -n 1
    cmds+=("python3 ${prep[*]}")
  done
  echo "$mode: ${#files[@]} run(s) of $from unpacked into $runs"
}
# write_record: OUT/env.json (device, versions, commit, commands, skipped kinds), OUT/results.{json,md}
# (kernelformer.reproduce.gpu_table), the logs and each run's results.json.
write_record() {
  $py - "$out/env.json" "${skipped[@]}" <<'PYEOF' || echo "environment record failed"
import json, platform, subprocess, sys
import jax, flax, optax, numpy
try:
  import orbax.checkpoint as ocp
  orbax = getattr(ocp, '__version__', '?')
except Exception:  # pylint: disable=broad-except
  orbax = 'absent'
def sh(*a):
  try:
    return subprocess.run(a, capture_output=True, text=True, timeout=20).stdout.strip()
  except Exception:  # pylint: disable=broad-except
    return ''
gpu = sh('nvidia-smi', '--query-gpu=name,driver_version,memory.total', '--format=csv,noheader')
env = {'device': gpu or f'{jax.devices()[0].device_kind} ({platform.processor() or platform.machine()})',
       'versions': f'jax {jax.__version__}, flax {flax.__version__}, optax {optax.__version__}, '
                   f'orbax {orbax}, numpy {numpy.__version__}, python {platform.python_version()}',
       'git_commit': sh('git', 'rev-parse', 'HEAD'), 'skipped': sys.argv[2:]}
with open(sys.argv[1], 'w') as f:
  json.dump(env, f)
PYEOF
  $py - "$out/env.json" "${cmds[@]}" <<'PYEOF'
import json, sys
env = json.load(open(sys.argv[1])) if __import__('os').path.exists(sys.argv[1]) else {}
env['commands'] = sys.argv[2:]
json.dump(env, open(sys.argv[1], 'w'))
PYEOF
  $py -m kernelformer.reproduce.gpu_table --out "$out" --env "$out/env.json" "${table[@]}"
  if [ -f "$out/instability-listops.md" ]; then
    { echo; cat "$out/instability-listops.md"; } >> "$out/results.md"
    cat "$out/instability-listops.md"
  fi
  for f in "$runs"/*.log; do cp "$f" "$out/" 2>/dev/null; done
  for d in "$runs"/*/; do n=$(basename "$d"); [ -f "$d/results.json" ] && cp "$d/results.json" "$out/results-$n.json"; done
  pack_runs
}

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
reproduce)
  # One call, one deadline (KF_REPRODUCE_DEADLINE seconds from here, default 540: the device's 600 s
  # command limit less the margin). Time line: the ListOps data is generated (CPU, ~115 s) while the
  # four Zoology runs share the GPU; they are stopped (SIGINT: the trainer checkpoints) when the data
  # is ready, at the earliest KF_REPRODUCE_ZOOLOGY_MIN_SECONDS (90) and at the latest
  # KF_REPRODUCE_ZOOLOGY_SECONDS (150) after the start; then the ListOps kinds train side by side until
  # KF_REPRODUCE_RESERVE_SECONDS (60) before the deadline (or KF_REPRODUCE_LISTOPS_SECONDS, if
  # shorter). A run its limit stops is tested at the step it reached (the best-validation checkpoint)
  # and its row says "truncated", never a full-schedule number. The test re-runs go side by side.
  # Measured on an H200 (docs/benchmarks/gpu-h200-2026-11-28-reproduce.md, KF_REPRODUCE_DEADLINE=550,
  # 530 s): data 115 s; the four Zoology runs 300-380 steps/s each side by side, all four done (two by
  # Zoology's stop) in 131 s; the ListOps pair 110-117 steps/s each side by side, so 359 s reached steps
  # 31,494 / 32,832 of 50,000. The full ListOps schedule needs ~450 s of training: the next call, on
  # the warm machine (the same /tmp), is reproduce-continue.
  py=${KF_PYTHON:-python3}
  t0=$SECONDS
  kinds=${KF_REPRODUCE_KINDS:-performer-skyformer skyformer}
  sky_secs=${KF_REPRODUCE_LISTOPS_SECONDS:-100000}
  zoo_secs=${KF_REPRODUCE_ZOOLOGY_SECONDS:-150}
  zoo_min=${KF_REPRODUCE_ZOOLOGY_MIN_SECONDS:-90}
  deadline=${KF_REPRODUCE_DEADLINE:-540}
  reserve=${KF_REPRODUCE_RESERVE_SECONDS:-60}
  # np.logspace(-4, -2, 4), descending (configs/sweeps/zoology_fig2_full.py)
  zlrs=${KF_REPRODUCE_ZOOLOGY_LRS:-0.01 0.0021544346900318843 0.00046415888336127773 0.0001}
  runs=${KF_REPRODUCE_RUNS:-/tmp/gpu_reproduce}
  zcfg=configs/mqar.py:zoology
  lo_tiny=(); zo_tiny=(); in_tiny=()
  if [ -n "${KF_REPRODUCE_DRY:-}" ]; then   # tiny sizes: the same commands in seconds on a CPU
    deadline=${KF_REPRODUCE_DEADLINE:-100000}   # runs end by themselves
    zoo_min=${KF_REPRODUCE_ZOOLOGY_MIN_SECONDS:-$zoo_secs}
    cfg=${KF_GPU_CONFIG:-configs/listops.py:tiny}
    lo_tiny=(--config.num_train_steps=4 --config.eval_every=2 --config.checkpoint_every=2)
    # the skyformer preset on listops:tiny's data, a 16-dim model, 3 steps, 2 seeds
    in_tiny=(--steps 3 --set data.max_length=32 --set data.min_gen_length=8 --set data.max_gen_length=32
             --set data.max_depth=3 --set data.max_args=3 --set data.num_train=256 --set data.num_val=64
             --set data.num_test=64 --set model.emb_dim=16 --set model.qkv_dim=16 --set model.mlp_dim=32
             --set batch_size=4 --set model.attention.num_landmarks=8 --set model.attention.num_features=8)
    zo_tiny=(--config.data.num_train=512 --config.data.num_val=64 --config.data.num_test=64
             --config.batch_size=16 --config.num_train_steps=4 --config.eval_every=2
             --config.checkpoint_every=2 --config.model.emb_dim=16 --config.model.qkv_dim=16)
  fi
  # Fail in seconds, not minutes, where the device's software cannot run the trainer.
  $py -c "import grain, ml_collections, tensorboardX, kernelformer.training.trainer, jax; print('jax', jax.__version__, jax.devices())" \
    || { echo "reproduce: the trainer does not import here"; exit 3; }
  rm -rf "$runs"; mkdir -p "$runs"
  cmds=(); table=(); skipped=()
  ok=()
  for kind in $kinds; do
    if $py -c "import sys; from kernelformer import registry; registry.get(sys.argv[1])" "$kind" 2>/dev/null; then
      ok+=("$kind")
    else
      echo "reproduce: attention kind $kind is not registered in this checkout; skipped (set KF_REPRODUCE_KINDS)"
      skipped+=("$kind: not registered in this checkout")
    fi
  done
  prep=(-m kernelformer prepare-data --config "$cfg" --data_dir "$data")
  ($py "${prep[@]}" > "$runs/prepare.log" 2>&1; echo "prepare rc $?" >> "$runs/prepare.log") &
  prep_pid=$!
  cmds+=("python3 ${prep[*]}")
  # start_run WD MEM_FRACTION SECONDS ROW ARGS..: python ARGS in the background under `timeout -s INT
  # SECONDS` (log WD.log; ARGS kept in WD.cmd for the re-run below), its pid added to pids, its
  # command to cmds and "--run ROW=WD" to the table.
  start_run() {
    local wd=$1 frac=$2 secs=$3 row=$4; shift 4
    printf '%s\n' "$@" > "$wd.cmd"
    XLA_PYTHON_CLIENT_MEM_FRACTION=$frac timeout -k 60 -s INT "$secs" $py "$@" > "$wd.log" 2>&1 &
    pids+=($!); cmds+=("timeout -k 60 -s INT $secs python3 $*")
    table+=(--run "$row=$wd")
  }
  # Zoology figure 2 (64, 4), attention, d_model KF_REPRODUCE_ZOOLOGY_D (64; 128 is the panel's other
  # column): the four learning rates side by side.
  zd=${KF_REPRODUCE_ZOOLOGY_D:-64}
  zdim=(); [ "$zd" != 64 ] && zdim=(--config.model.emb_dim="$zd" --config.model.qkv_dim="$zd")
  pids=()
  for lr in $zlrs; do
    wd=$runs/zoology-d$zd-lr$lr
    start_run "$wd" 0.2 "$zoo_secs" "zoology-fig2-L64-d$zd:softmax lr $lr" -m kernelformer train \
      --config "$zcfg" --workdir "$wd" --config.optim.learning_rate="$lr" --config.progress=False \
      "${zdim[@]}" "${zo_tiny[@]}"
  done
  # The data first; the Zoology runs go on until zoo_min, then stop (or end by themselves, or at zoo_secs).
  wait "$prep_pid"; tail -n 2 "$runs/prepare.log"
  while [ $((SECONDS - t0)) -lt "$zoo_min" ] && [ -n "$(jobs -rp)" ]; do sleep 1; done
  for p in "${pids[@]}"; do kill -INT "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p"; done
  echo "reproduce: Zoology runs done at $((SECONDS - t0)) s"
  left=$((deadline - reserve - (SECONDS - t0)))
  [ "$left" -lt "$sky_secs" ] && sky_secs=$left
  [ "$sky_secs" -lt 30 ] && sky_secs=30
  echo "reproduce: ListOps runs get $sky_secs s"
  # Skyformer table 1, ListOps: the kinds side by side on the one GPU.
  pids=()
  if [ -n "${KF_REPRODUCE_INSTABILITY:-}" ]; then
    # Opt-in: Skyformer table 3's ListOps column (kernelformer reproduce instability) beside the pair,
    # writing OUT/instability-listops.{json,md} after every kind (a time limit keeps what finished).
    ic=(-m kernelformer reproduce instability --task listops --seeds "${KF_REPRODUCE_INSTABILITY_SEEDS:-3}"
        --set data.data_dir="$data" --out_dir "$out" "${in_tiny[@]}")
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.15 timeout -s INT "$sky_secs" $py "${ic[@]}" > "$runs/instability.log" 2>&1 &
    pids+=($!); cmds+=("timeout -s INT $sky_secs python3 ${ic[*]}")
  fi
  for kind in "${ok[@]}"; do
    wd=$runs/listops-$kind
    sc=(-m kernelformer train --config "$cfg" --workdir "$wd" --config.data.data_dir="$data"
        --config.model.attention.kind="$kind" --config.progress=False "${lo_tiny[@]}")
    if [ -n "${KF_REPRODUCE_DRY:-}" ]; then   # 8 landmarks / features at the tiny length
      case $kind in skyformer|nystromformer) sc+=(--config.model.attention.num_landmarks=8) ;;
                    performer-skyformer|performer-zoology) ;;   # M fixed by the kind (its source's)
                    *) sc+=(--config.model.attention.num_features=8) ;; esac
    fi
    start_run "$wd" 0.4 "$sky_secs" "skyformer-table1-listops:$kind" "${sc[@]}"
  done
  for p in "${pids[@]}"; do wait "$p"; done
  echo "reproduce: ListOps runs done at $((SECONDS - t0)) s"
  test_where_stopped
  echo "reproduce: tests done at $((SECONDS - t0)) s"
  # What a next call (reproduce-continue) needs: the table's rows, the commands so far, what was skipped.
  printf '%s\n' "${table[@]}" > "$runs/table.args"
  printf '%s\n' "${cmds[@]}" > "$runs/commands.txt"
  printf '%s\n' "${skipped[@]}" | grep -v '^$' > "$runs/skipped.txt"
  write_record
  ;;
reproduce-continue)
  # The next call: every run of the last reproduce call that its time limit stopped ("truncated")
  # continues from its newest checkpoint toward its planned schedule -- its own command plus
  # --config.allow_config_change=True -- all side by side until KF_REPRODUCE_RESERVE_SECONDS (60) before
  # KF_REPRODUCE_DEADLINE (540); a run stopped again is tested where it stands; OUT/results.{json,md}
  # then cover every run of both calls, and OUT/continue-*.tar.gz hold what is still truncated.
  # On the warm machine the runs and the data are where the last call left them (/tmp stays). On a
  # fresh machine (the warm one was given back between calls): copy the last call's
  # OUT/continue-*.tar.gz into the working tree (an ignored folder, e.g. .gpudata/, named in the run's
  # carry) and set KF_REPRODUCE_FROM to that folder; the runs are unpacked and their data generated
  # again (~115 s for ListOps) before they continue.
  py=${KF_PYTHON:-python3}
  t0=$SECONDS
  deadline=${KF_REPRODUCE_DEADLINE:-540}
  reserve=${KF_REPRODUCE_RESERVE_SECONDS:-60}
  runs=${KF_REPRODUCE_RUNS:-/tmp/gpu_reproduce}
  from=${KF_REPRODUCE_FROM:-}
  if [ -n "$from" ] && [ -f "$runs/table.args" ]; then
    echo "reproduce-continue: this machine still holds the last call's runs in $runs; they continue (KF_REPRODUCE_FROM not read)"
    from=
  fi
  cmds=()
  [ -n "$from" ] && unpack_runs "$from"
  more_cmds=("${cmds[@]}")
  load_runs
  cmds+=("${more_cmds[@]}")
  secs=$((deadline - reserve - (SECONDS - t0)))
  pids=()
  for arg in "${table[@]}"; do
    [ "$arg" = --run ] && continue
    wd=${arg#*=}
    [ "$(run_status "$wd")" = truncated ] || continue
    mapfile -t more < "$wd.cmd"
    more+=(--config.allow_config_change=True)
    XLA_PYTHON_CLIENT_MEM_FRACTION=${KF_REPRODUCE_MEM_FRACTION:-0.4} timeout -k 60 -s INT "$secs" $py "${more[@]}" >> "$wd.log" 2>&1 &
    pids+=($!); cmds+=("timeout -k 60 -s INT $secs python3 ${more[*]}")
    echo "reproduce-continue: $wd continues (at most $secs s)"
  done
  for p in "${pids[@]}"; do wait "$p"; done
  echo "reproduce-continue: runs done at $((SECONDS - t0)) s"
  test_where_stopped
  printf '%s\n' "${cmds[@]}" > "$runs/commands.txt"
  write_record
  ;;
record)
  py=${KF_PYTHON:-python3}
  runs=${KF_REPRODUCE_RUNS:-/tmp/gpu_reproduce}
  load_runs
  write_record
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
