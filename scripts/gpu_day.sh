#!/usr/bin/env bash
# One short GPU lease, prepared in advance (the project gets ~15 device-minutes per session).
#
#   bash scripts/gpu_day.sh check OUT_DIR [BUDGET_SCALE]   # part 1: gpu_check.py + loop benchmark,
#                                                          #   ListOps (skyformer preset) generated meanwhile
#   bash scripts/gpu_day.sh listops OUT_DIR SECONDS KIND.. # part 2: ListOps at the Skyformer preset, each
#                                                          #   KIND trained for SECONDS, then tested
#   bash scripts/gpu_day.sh all OUT_DIR BUDGET_SCALE SECONDS KIND..   # both in one call (one machine start)
#   bash scripts/gpu_day.sh reproduce OUT_DIR              # first on any lent GPU (<= 9 device-minutes):
#                                                          #   measures, plans (printed with its estimate)
#                                                          #   and trains as populations Skyformer table 1's
#                                                          #   ListOps column, Zoology figure 2's (64, 4)
#                                                          #   panel, Skyformer table 3 seeds, in that
#                                                          #   order (kernelformer/reproduce/gpu_plan.py);
#                                                          #   OUT_DIR/results.{json,md}. KF_REPRODUCE_DRY=1:
#                                                          #   a CPU dry run at tiny sizes (the test suite's)
#   bash scripts/gpu_day.sh reproduce-continue OUT_DIR     # the next call: the runs reproduce did not
#                                                          #   finish continue toward their
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
    if [ -z "$step" ]; then echo "$wd: no checkpoint"; tail -n 5 "$wd.log" 2>/dev/null; continue; fi
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
# pack_runs: OUT/continue-<run>.tar.gz, one for every run of $runs not finished (a population member:
# <job>_<member>): what reproduce-continue needs to continue it on another machine (this one given
# back, or its lease over): the run's whole workdir, if it started (checkpoints, best checkpoints,
# metrics, records; its lock and TensorBoard files left out) and command, and the call's table and
# commands with every finished run's results.json. One file a run, since the
# device returns files of at most 16 MiB: a ListOps run at the skyformer preset (206k parameters,
# 2 + 2 checkpoints of parameters and Adam moments) is ~9 MB.
pack_runs() {
  local arg wd n r common=(table.args runs_dir.txt) left=() items
  rm -f "$out"/continue-*.tar.gz
  for n in commands.txt skipped.txt; do [ -f "$runs/$n" ] && common+=("$n"); done
  for arg in "${table[@]}"; do
    [ "$arg" = --run ] && continue
    wd=${arg#*=}; r=${wd#"$runs"/}
    [ "$r" != "$wd" ] && [ -f "$wd.cmd" ] || continue
    if [ "$(run_status "$wd")" = finished ]; then common+=("$r/results.json"); else left+=("$r"); fi
  done
  [ ${#left[@]} -gt 0 ] || return 0
  printf '%s\n' "$runs" > "$runs/runs_dir.txt"
  for r in "${left[@]}"; do
    n=$out/continue-${r//[\/=,]/_}.tar.gz; items=("$r.cmd"); [ -d "$runs/$r" ] && items+=("$r")
    if tar -czf "$n" -C "$runs" --exclude=lock --exclude=tensorboard "${common[@]}" "${items[@]}"; then
      echo "$mode: $r packed to $n ($(du -k "$n" | cut -f1) KiB)"
    else
      echo "$mode: packing $r failed"; rm -f "$n"
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
  for path in [os.path.join(runs, 'table.args')] + glob.glob(os.path.join(runs, '**', '*.cmd'), recursive=True):
    text = open(path).read().replace(old + '/', runs + '/')
    open(path, 'w').write(text)
PYEOF
  for c in "$runs"/*.cmd "$runs"/*/*.cmd; do
    [ -f "$c" ] || continue
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
  # command limit less the margin), planned by kernelformer/reproduce/gpu_plan.py (the jobs, their
  # order and selection): while the ListOps data is generated (CPU, ~115 s on an H200) each job's
  # population is measured for a few seconds; the plan, printed with its estimate, then runs one
  # population after another, each until it ends or KF_REPRODUCE_RESERVE_SECONDS (60) before the
  # deadline. A run its limit stops is tested at the step it reached (its row says "truncated", never
  # a full-schedule number); what did not finish is packed for reproduce-continue.
  py=${KF_PYTHON:-python3}
  t0=$SECONDS
  deadline=${KF_REPRODUCE_DEADLINE:-540}
  reserve=${KF_REPRODUCE_RESERVE_SECONDS:-60}
  runs=${KF_REPRODUCE_RUNS:-/tmp/gpu_reproduce}
  if [ -n "${KF_REPRODUCE_DRY:-}" ]; then   # tiny sizes: the same commands in seconds on a CPU
    deadline=${KF_REPRODUCE_DEADLINE:-100000}
    cfg=${KF_GPU_CONFIG:-configs/listops.py:tiny}
  fi
  # Fail in seconds, not minutes, where the device's software cannot run the trainer.
  $py -c "import grain, ml_collections, tensorboardX, kernelformer.training.trainer, jax; print('jax', jax.__version__, jax.devices())" \
    || { echo "reproduce: the trainer does not import here"; exit 3; }
  rm -rf "$runs"; mkdir -p "$runs"
  cmds=()
  prep=(-m kernelformer prepare-data --config "$cfg" --data_dir "$data")
  ($py "${prep[@]}" > "$runs/prepare.log" 2>&1; echo "prepare rc $?" >> "$runs/prepare.log") &
  prep_pid=$!
  cmds+=("python3 ${prep[*]}")
  plan=($py -m kernelformer.reproduce.gpu_plan --runs "$runs" --data "$data" --out "$out" --config "$cfg")
  "${plan[@]}" measure --seconds $((deadline - reserve - (SECONDS - t0))) > "$runs/measure.log" 2>&1 \
    || { grep '^reproduce:' "$runs/measure.log" || tail -n 5 "$runs/measure.log"; kill "$prep_pid"; exit 2; }
  grep -E '^(measure|reproduce):' "$runs/measure.log"
  wait "$prep_pid"; tail -n 2 "$runs/prepare.log"
  "${plan[@]}" plan --seconds $((deadline - reserve - (SECONDS - t0))) || exit 2
  mapfile -t table < "$runs/table.args"
  mapfile -t skipped < "$runs/skipped.txt"
  mapfile -t jobs < "$runs/jobs.txt"
  for job in "${jobs[@]}"; do
    left=$((deadline - reserve - (SECONDS - t0)))
    [ "$left" -ge 10 ] || { echo "reproduce: $job not started (the deadline)"; continue; }
    mapfile -t args < "$runs/$job.cmd"
    timeout -k 60 -s INT "$left" $py "${args[@]}" > "$runs/$job.log" 2>&1
    echo "reproduce: $job rc $? at $((SECONDS - t0)) s"
    cmds+=("timeout -k 60 -s INT $left python3 ${args[*]}")
  done
  test_where_stopped
  echo "reproduce: tests done at $((SECONDS - t0)) s"
  printf '%s\n' "${cmds[@]}" > "$runs/commands.txt"
  write_record
  ;;
reproduce-continue)
  # The next call: every run of the last reproduce call that did not finish (a population member
  # alone, as its workdir is a single run's) continues from its newest checkpoint, or starts, toward
  # its planned schedule -- its own command plus
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
  pids=(); todo=()
  for arg in "${table[@]}"; do
    [ "$arg" = --run ] && continue
    wd=${arg#*=}
    [ -f "$wd.cmd" ] && [ "$(run_status "$wd")" != finished ] && todo+=("$wd")
  done
  frac=$(awk -v n=${#todo[@]} 'BEGIN { f = 0.9 / (n ? n : 1); print (f > 0.4 ? 0.4 : f) }')
  for wd in "${todo[@]}"; do
    mapfile -t more < "$wd.cmd"
    more+=(--config.allow_config_change=True)
    XLA_PYTHON_CLIENT_MEM_FRACTION=${KF_REPRODUCE_MEM_FRACTION:-$frac} timeout -k 60 -s INT "$secs" $py "${more[@]}" >> "$wd.log" 2>&1 &
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
