#!/usr/bin/env bash
# The chaos suite: trainings under `titan launch` with a fault each, every one of which must end
# with the final loss of the run without a fault, bit for bit.
#   scripts/chaos.sh [--runs 20] [--ranks 2] [--steps 16] [--interval 4] [--seed 1]
#                    [--faults kill,stop,corrupt,nan,usr1,modelonly] [--model deepseek_v32] [--keep]
# Faults, taken in turn (each at a random step >= 2, on a random rank):
#   kill     SIGKILL one rank: the supervisor restarts the job from the last committed checkpoint
#   stop     SIGSTOP one rank (a hang): the others' watchdog aborts after comm.timeout_seconds
#            (3 s here), then the restart
#   corrupt  flip a byte of the newest committed checkpoint, then SIGKILL a rank: the restart finds
#            it damaged and falls back to the one before (so up to 2 intervals are lost)
#   nan      a NaN in one rank's gradient with fault.on_nonfinite = "rollback": the run reloads its
#            last checkpoint and skips the batch, ending as a run that skipped it from the start
#   usr1     SIGUSR1 to the launcher's process group (a batch system's warning before its time
#            limit): the job saves a checkpoint and the launcher exits 0; the same command, run
#            again, resumes from it
#   modelonly a run that ends at that step with checkpoint.last_save_model_only = true (its final
#            save holds the weights alone), then the full run's command: it resumes from the newest
#            full checkpoint before the export, never from step 0; with its own reference, both
#            without LR decay, so that a shorter first run trains the same steps
# Prints recoveries / runs, the losses that differ, and the median and max seconds from the
# fault to training again (the restarted run's first finished step). Exits 1 unless all pass.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
runs=20 ranks=2 steps=16 interval=4 seed=1 faults=kill,stop,corrupt,nan,usr1,modelonly model=deepseek_v32 keep=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --runs) runs=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --interval) interval=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --faults) faults=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    *) echo "chaos: unknown option $1 (see the top of $0)" >&2; exit 2 ;;
  esac
done
titan=$root/build/titan
[[ -x $titan ]] || { echo "chaos: $titan is missing; build it first (scripts/build.sh build)" >&2; exit 1; }
scripts/prepare_data.sh "$titan" >/dev/null
export OMP_NUM_THREADS=1 OMP_PROC_BIND=false
work=$(mktemp -d /tmp/titan_chaos.XXXXXX)
cleanup() {
  [[ -n ${launcher:-} ]] && kill -KILL "$launcher" 2>/dev/null || true
  pkill -KILL -f "titan train --config configs/${model}_debug.toml --job.dump_folder=$work" 2>/dev/null || true
  [[ $keep == 1 ]] || rm -rf "$work"
}
trap cleanup EXIT
RANDOM=$seed
IFS=, read -r -a kinds <<<"$faults"
# A fault at step 2..steps-2; a damaged checkpoint needs two committed ones before it, a NaN one.
max_at=$((steps - 2))
if ((max_at < 2 * interval + 1)); then
  echo "chaos: --steps $steps is too short for --interval $interval (needs >= $((2 * interval + 3)))" >&2
  exit 2
fi

# A short run of the debug model: 128-token sequences, DeepSeek-V3.2's dense warm-up for 3 steps
# then sparse training of everything, asynchronous checkpoints every `interval` steps, the
# watchdog at 3 s once training runs.
train_args() {  # $1: run folder
  echo "train --config configs/${model}_debug.toml --job.dump_folder=$1 --training.steps=$steps" \
    "--training.seq_len=128 --lr_scheduler.warmup_steps=4 --dsa.warmup_steps=3 --metrics.log_freq=1" \
    "--validation.enable=false" \
    "--checkpoint.enable=true --checkpoint.interval=$interval --checkpoint.keep_latest_k=3" \
    "--checkpoint.async_mode=async --comm.timeout_seconds=3"
}
json_field() { sed -n "s/.*\"$2\":\([^,}]*\).*/\1/p" "$1" 2>/dev/null; }
step_of() { json_field "$1/progress.json" step; }
launch() {  # $1: run folder, rest: more train args; runs in the background, sets $launcher
  # setsid: the launcher leads a process group of its own, as a batch system's job step does
  # shellcheck disable=SC2046
  setsid "$titan" launch -np "$ranks" --max-restarts 3 -- $(train_args "$1") "${@:2}" >"$1.log" 2>&1 &
  launcher=$!
}
rank_pids() { pgrep -f "^[^ ]*titan train --config configs/${model}_debug.toml --job.dump_folder=$1 " || true; }
wait_for_step() {  # $1: run folder, $2: step; fails after 120 s
  for _ in $(seq 1 1200); do
    local s; s=$(step_of "$1"); [[ -n $s && $s -ge $2 ]] && return 0
    kill -0 "$launcher" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

reference=$work/reference
launch "$reference"
wait "$launcher" || { echo "chaos: the run without faults failed:"; tail -20 "$reference.log"; exit 1; }
want=$(json_field "$reference/progress.json" loss)
echo "chaos: $runs runs of $model debug on $ranks ranks, $steps steps, checkpoints every $interval;" \
  "final loss without faults: $want"

recovered=0 differing=0 worst_lost=0
recoveries=()
for ((i = 0; i < runs; i++)); do
  kind=${kinds[$((i % ${#kinds[@]}))]}
  at=$((2 + RANDOM % (max_at - 1)))
  victim=$((RANDOM % ranks))
  run=$work/run$i
  expect=$want
  if [[ $kind == nan ]]; then  # its own reference: the same batch skipped from the start
    [[ $at -le $interval ]] && at=$((interval + 1 + RANDOM % (max_at - interval)))  # a checkpoint to roll back to
    launch "$run.skip" --fault.on_nonfinite=skip --fault.inject_nonfinite_at_step=$at --fault.inject_rank=$victim
    wait "$launcher" || true
    expect=$(json_field "$run.skip/progress.json" loss)
    launch "$run" --fault.on_nonfinite=rollback --fault.inject_nonfinite_at_step=$at --fault.inject_rank=$victim
  elif [[ $kind == modelonly ]]; then
    [[ $at -le $interval ]] && at=$((interval + 1 + RANDOM % (max_at - interval)))  # a full checkpoint before it
    launch "$run.ref" --lr_scheduler.decay_ratio=0
    wait "$launcher" || true
    expect=$(json_field "$run.ref/progress.json" loss)
    launch "$run" --lr_scheduler.decay_ratio=0 --training.steps=$at --checkpoint.last_save_model_only=true
    wait "$launcher" && exported=1 || exported=0
    mv "$run.log" "$run.export.log"
    full=$(((at - 1) / interval * interval))  # the newest full checkpoint before the export at step $at
    launch "$run" --lr_scheduler.decay_ratio=0
  else
    # two committed checkpoints by then, so that the one before the damaged one exists
    [[ $kind == corrupt && $at -le $((2 * interval)) ]] && at=$((2 * interval + 1 + RANDOM % (max_at - 2 * interval)))
    launch "$run"
  fi
  fault_time="" stopped=0 stopped_at=""
  if [[ $kind == usr1 ]] && wait_for_step "$run" "$at"; then  # save and stop, then the same command again
    fault_time=$(date +%s.%N)
    kill -USR1 -- "-$launcher"
    wait "$launcher" && stopped=1 || stopped=0
    grep -q "stopped on request, with a checkpoint" "$run.log" || stopped=0
    stopped_at=$(step_of "$run")
    mv "$run.log" "$run.stopped.log"
    launch "$run"
  fi
  if [[ $kind != nan && $kind != usr1 && $kind != modelonly ]] && wait_for_step "$run" "$at"; then
    pids=($(rank_pids "$run"))
    if ((${#pids[@]} > 0)); then  # (none: the run ended first, and the fault counts as not recovered)
      pid=${pids[$((victim % ${#pids[@]}))]}
      if [[ $kind == corrupt ]]; then
        # Every rank stopped (no commit can land meanwhile), one byte of the newest committed
        # checkpoint's first file flipped, then the victim killed and the others let go.
        kill -STOP "${pids[@]}" 2>/dev/null || true
        newest=$(ls -d "$run"/checkpoint/step-* | grep -E '/step-[0-9]+$' | sed 's/.*step-//' | sort -n | tail -1)
        file=$(ls "$run/checkpoint/step-$newest"/shard-*.safetensors | head -1)
        offset=$(($(stat -c %s "$file") - 64))
        byte=$(od -An -tu1 -j "$offset" -N1 "$file" | tr -d ' ')
        printf "\\x$(printf %02x $((byte ^ 0x5a)))" | dd of="$file" bs=1 seek="$offset" conv=notrunc status=none
      fi
      fault_time=$(date +%s.%N)
      if [[ $kind == stop ]]; then kill -STOP "$pid"; else kill -KILL "$pid"; fi
      [[ $kind == corrupt ]] && { kill -CONT "${pids[@]}" 2>/dev/null || true; }
    fi
  fi
  wait "$launcher" && ok=1 || ok=0
  got=$(json_field "$run/progress.json" loss)
  restarts=$(grep -c '"restart"' "$run/restarts.jsonl" 2>/dev/null || true)
  if [[ $kind == nan ]]; then
    rolled=$(grep -c "rolled back to" "$run.log" || true)
    [[ $ok == 1 && $rolled -ge 1 ]] && recovered=$((recovered + 1))
    detail="rolled back $rolled time(s)"
  elif [[ $kind == usr1 ]]; then
    resumed=$(json_field "$run/progress.json" resumed_from)
    if [[ $ok == 1 && ${stopped:-0} == 1 && -n ${stopped_at:-} && ${resumed:-} == "$stopped_at" && ${restarts:-0} == 0 ]]; then
      recovered=$((recovered + 1))
      detail="stopped with a checkpoint at step $stopped_at, resumed from it by the same command"
    else
      detail="NOT RECOVERED (stopped ${stopped:-0}, at step ${stopped_at:-?}, resumed from ${resumed:-?}, restarts ${restarts:-0}); see $run.stopped.log and $run.log"
    fi
  elif [[ $kind == modelonly ]]; then
    resumed=$(json_field "$run/progress.json" resumed_from)
    if [[ $ok == 1 && $exported == 1 && ${resumed:-} == "$full" ]] && grep -q "holds the weights alone" "$run.log"; then
      recovered=$((recovered + 1))
      detail="weights-only export at step $at; the rerun resumed from step $full, the newest full checkpoint"
    else
      detail="NOT RECOVERED (export ok $exported, resumed from ${resumed:-?}, expected $full); see $run.export.log and $run.log"
    fi
  else
    again=$(json_field "$run/restarts.jsonl" training_again_at | head -1)
    lost=$(json_field "$run/restarts.jsonl" steps_lost | head -1)
    fell_back=1
    [[ $kind == corrupt ]] && { grep -q "is damaged, set aside" "$run.log" || fell_back=0; }
    if [[ $ok == 1 && ${restarts:-0} -ge 1 && -n $again && -n $fault_time && $fell_back == 1 ]]; then
      recovered=$((recovered + 1))
      seconds=$(awk -v a="$again" -v f="$fault_time" 'BEGIN { printf "%.1f", a - f }')
      recoveries+=("$seconds")
      [[ ${lost:-0} -gt $worst_lost ]] && worst_lost=$lost
      detail="$restarts restart(s), ${lost:-?} steps lost, training again after ${seconds} s"
    else
      detail="NOT RECOVERED (launcher ok=$ok, restarts ${restarts:-0}, fell back $fell_back); see $run.log"
    fi
  fi
  verdict="same final loss"
  if [[ $got != "$expect" ]]; then differing=$((differing + 1)); verdict="FINAL LOSS $got != $expect"; fi
  printf 'chaos run %2d: %-7s at step %2d on rank %d: %s; %s\n' "$i" "$kind" "$at" "$victim" "$detail" "$verdict"
done

median=-; max=-
if [[ ${#recoveries[@]} -gt 0 ]]; then
  sorted=($(printf '%s\n' "${recoveries[@]}" | sort -n))
  median=${sorted[$(((${#sorted[@]} - 1) / 2))]}
  max=${sorted[$((${#sorted[@]} - 1))]}
fi
echo "chaos: $recovered/$runs recovered, $differing final losses differing, fault to training again:" \
  "median $median s, max $max s over ${#recoveries[@]} restarts; at most $worst_lost steps lost"
[[ $recovered == "$runs" && $differing == 0 ]]
