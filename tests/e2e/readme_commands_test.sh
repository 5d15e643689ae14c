#!/usr/bin/env bash
# Every command in README.md runs as written. The README is the first thing a user copies from; a
# renamed config, script, subcommand or flag must fail here, not on their machine.
#   tests/e2e/readme_commands_test.sh TITAN_BINARY [README.md]
#
# The README's shell code blocks (``` with no language, bash or sh; ```text is output, not
# commands) are read in order, continuation lines joined, comments dropped, `a && b` split. Each
# command is run in a temporary folder that links the repository's configs/, scripts/, bench/,
# tests/ and docs/, with build/ the binary's build folder, a small seeded corpus in data/kjv and
# my_corpus.txt, and a stand-in for the main job's run in outputs/main. Then, by what it is:
#
#   cheap, run for real (must exit 0): titan info / plan / tokenizer / data / ckpt / generate /
#     plot / --help, a 1-rank `titan train` of a debug config (with --training.steps=1 appended:
#     the last value wins), ls, printf, `ctest` (as `ctest -N`, listing the tests);
#   expensive, checked without their cost:
#     scripts and bench scripts: the file exists, is executable, parses (bash -n), and each
#       --flag it is given appears in it; scripts/main.sh also has its default run's overrides
#       checked and a 2-step stand-in run of its config (the outputs the README lists must appear);
#     `titan train` under mpirun / scripts/mpirun.sh / srun / titan launch, or of a big config:
#       `titan plan --config C --world-size N <the same overrides>` must accept the config, every
#       key and the mesh; mpirun's and titan launch's own options must be in their --help;
#     titan fr analyze: the subcommand's --help answers.
#   Anything else (an unknown program, a missing file) fails.
#
# Besides the blocks: every link and every repository path the README names in backticks must
# exist, every `titan <command>` must answer --help, and every `section.key` config key it names
# must be one `titan train --help` lists.
set -uo pipefail
titan=$(realpath "$1")
root=$(cd "$(dirname "$0")/../.." && pwd)
readme=$(realpath "${2:-$root/README.md}")
build=$(dirname "$titan")
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OMP_WAIT_POLICY=PASSIVE
tmp=$(mktemp -d /tmp/readme_commands.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
log=$tmp/log
fails=0 checked=0 ran=0
fail() { echo "FAIL (README.md:$line): $*"; fails=$((fails + 1)); }
ok() { echo "ok   (README.md:$line): $*"; }

# Runs a command in the temporary folder (or $cwd under it); on failure prints its output's tail.
run_real() {
  local what=$1; shift
  if (cd "$tmp/$cwd" && "$@") >"$log" 2>&1; then ran=$((ran + 1)); ok "ran: $what"
  else fail "exit $? from: $what"; tail -n 15 "$log" | sed 's/^/    /'; fi
}
check_real() {  # like run_real, for a check (counted as checked)
  local what=$1; shift
  if (cd "$tmp/$cwd" && "$@") >"$log" 2>&1; then checked=$((checked + 1)); ok "checked: $what"
  else fail "$what"; tail -n 15 "$log" | sed 's/^/    /'; fi
}

# ---- the temporary folder ----------------------------------------------------------------------
for d in configs scripts bench tests docs reference src; do ln -s "$root/$d" "$tmp/$d"; done
ln -s "$build" "$tmp/build"
mkdir -p "$tmp/data"
for _ in $(seq 20); do cat "$root/tests/fixtures/tokenizer/corpus.txt"; done >"$tmp/data/kjv.txt"
cp "$tmp/data/kjv.txt" "$tmp/my_corpus.txt"  # the README's "your own text"
( cd "$tmp" && "$titan" tokenizer train --input data/kjv.txt --vocab-size 2048 --output data/kjv_tokenizer.json &&
  "$titan" data prepare --input data/kjv.txt --tokenizer data/kjv_tokenizer.json --output data/kjv ) >"$log" 2>&1 ||
  { echo "FAIL: could not seed the corpus:"; cat "$log"; exit 1; }
train_help=$("$titan" train --help 2>&1)
mpirun_help=$(mpirun --help all 2>&1)

# ---- the pieces of a command ---------------------------------------------------------------------
# Splits a command line into words as bash would (no globbing, no brace expansion), refusing
# anything that would run code on its own.
split_words() {
  local cmd=$1
  if [[ $cmd == *'$('* || $cmd == *'`'* ]]; then return 1; fi
  set -f; set +B
  eval "words=($cmd)" 2>/dev/null; local rc=$?
  set +f; set -B
  return $rc
}

# `titan train` checked by `titan plan` at world size $1: config, keys and mesh.
plan_check() {
  local np=$1; shift
  local args=() config="" a
  while (($#)); do
    a=$1; shift
    case $a in
      --config) config=$1; args+=(--config "$1"); shift ;;
      --config=*) config=${a#--config=}; args+=("$a") ;;
      *) args+=("$a") ;;
    esac
  done
  [[ -n $config ]] || { fail "titan train without --config"; return; }
  [[ -f $tmp/$cwd/$config ]] || { fail "no config $config"; return; }
  check_real "titan plan --world-size $np for: train ${args[*]}" "$titan" plan --world-size "$np" "${args[@]}"
}

# A `titan ...` command; $1: the world size when launched (empty: a plain 1-rank run).
titan_cmd() {
  local np=$1; shift
  local sub=${1:-}
  case $sub in
    train)
      shift
      local config="" a expensive=0
      for a in "$@"; do
        [[ $a == /* || $a == --*=/* ]] && expensive=1  # a path outside the temporary folder (e.g. /nvme)
        [[ $a == --help ]] && { run_real "titan train --help" "$titan" train --help; return; }
      done
      config=$(printf '%s\n' "$@" | grep -A1 -x -- --config | tail -n1)
      [[ -z $config ]] && config=$(printf '%s\n' "$@" | sed -n 's/^--config=//p')
      [[ $config == configs/*_debug.toml ]] || expensive=1
      if [[ -n $np || $expensive == 1 ]]; then plan_check "${np:-1}" "$@"
      else
        [[ -f $tmp/$cwd/$config ]] || { fail "no config $config"; return; }
        run_real "${envs[*]} titan train $* --training.steps=1" env "${envs[@]}" "$titan" train "$@" \
          --training.steps=1 --validation.steps=1
      fi ;;
    launch)
      shift
      local lnp="" a
      local launch_help; launch_help=$("$titan" launch --help 2>&1)
      while (($#)) && [[ $1 != -- ]]; do
        a=$1; shift
        grep -qw -- "${a%%=*}" <<<"$launch_help" || fail "titan launch has no option $a"
        case $a in -np) lnp=$1; shift ;; --max-restarts) shift ;; esac
      done
      [[ ${1:-} == -- ]] && shift
      [[ ${1:-} == train ]] || { fail "titan launch runs something else than train: $*"; return; }
      shift
      plan_check "${lnp:-1}" "$@" ;;
    fr)
      [[ ${2:-} == analyze ]] || { fail "titan fr ${2:-}: only analyze exists"; return; }
      check_real "titan fr --help" "$titan" fr --help ;;
    info|plan|tokenizer|data|ckpt|generate|plot|--help|-h)
      [[ -z $np || $sub == info || $sub == --help ]] || { fail "titan $sub is not run under a launcher"; return; }
      run_real "${envs[*]} titan $*" env "${envs[@]}" "$titan" "$@" ;;
    *) fail "titan has no command '$sub'" ;;
  esac
}

# mpirun (or scripts/mpirun.sh) OPTIONS build/titan ...: every option in mpirun's help, then titan.
mpirun_cmd() {
  local np="" a
  while (($#)); do
    a=$1
    case $a in
      build/titan|titan) shift; titan_cmd "${np:-1}" "$@"; return ;;
      -np|-n|--np|-c) np=$2; shift 2 ;;
      --mca|-mca) grep -q -- "-mca" <<<"$mpirun_help" || fail "mpirun has no $a"; shift 3 ;;
      -*)
        grep -q -- " ${a}\b\|${a}|\||${a} \|^${a} " <<<"$mpirun_help" || fail "mpirun has no option $a"
        case $a in --hostfile|-hostfile|--bind-to|-x|-H|--host) [[ $a == --hostfile ]] && { [[ -f $tmp/$cwd/$2 ]] || fail "no hostfile $2 (made by an earlier command?)"; }; shift 2 ;; *) shift ;; esac ;;
      *) fail "mpirun runs something else than titan: $a"; return ;;
    esac
  done
  fail "mpirun without a program"
}

# srun OPTIONS build/titan ...: Slurm is not here; the options it takes are the usual ones.
srun_cmd() {
  local n="" nodes="" per="" a
  while (($#)); do
    a=$1
    case $a in
      build/titan|titan) shift; titan_cmd "${n:-$((nodes * per))}" "$@"; return ;;
      -n) n=$2; shift 2 ;;
      -N) nodes=$2; shift 2 ;;
      --ntasks-per-node=*) per=${a#*=}; shift ;;
      --mpi=*) shift ;;
      *) fail "srun option this test does not know: $a"; return ;;
    esac
  done
  fail "srun without a program"
}

# A script: it exists, is executable and parses; every --flag given to it appears in it.
script_cmd() {
  local script=$1; shift
  local path=$tmp/$cwd/$script a
  [[ -f $path ]] || { fail "no script $script"; return; }
  [[ -x $path ]] || { fail "$script is not executable"; return; }
  bash -n "$path" || { fail "$script does not parse"; return; }
  [[ $script == scripts/mpirun.sh ]] && { mpirun_cmd "$@"; return; }  # its options are mpirun's
  for a in "$@"; do
    [[ $a == -- ]] && break
    [[ $a == --* ]] && { grep -qw -- "${a%%=*}" "$path" || fail "$script takes no ${a%%=*}"; }
  done
  case $script in
    scripts/netns_hosts.sh) grep -q "^ *$1)" "$path" || fail "$script has no subcommand $1" ;;
    scripts/main.sh) main_job_standin ;;
  esac
  checked=$((checked + 1)); ok "checked: $script $*"
}

# scripts/main.sh runs for minutes: its default run's overrides must be accepted, and its config,
# run for 2 steps on the seeded corpus, must write what the README says a run writes.
main_job_standin() {
  local defaults
  mapfile -t defaults < <(sed -n '/default_run=(/,/)/p' "$root/scripts/main.sh" | grep -o -- '--[a-z_]*\.[a-z_]*=[^ )]*')
  ((${#defaults[@]} > 0)) || fail "found no default run in scripts/main.sh"
  local config; config=$(sed -n 's/^ *config=\(configs\/[a-z0-9_]*\.toml\)$/\1/p' "$root/scripts/main.sh")
  check_real "scripts/main.sh's default run: titan plan --config $config ${defaults[*]}" \
    "$titan" plan --config "$config" "${defaults[@]}"
  rm -rf "$tmp/outputs/main"
  check_real "scripts/main.sh's training, 2 steps" "$titan" train --config "$config" --job.dump_folder=outputs/main \
    --training.dataset_path=data/kjv --model.tokenizer_path=data/kjv_tokenizer.json --validation.enable=true \
    "${defaults[@]}" --training.steps=2 --training.seq_len=64 --validation.seq_len=64 --validation.steps=1 \
    --profiling.profile_freq=1
  local f
  for f in metrics.jsonl config.toml checkpoint/step-2/metadata.json plots/loss.png plots/throughput.png \
           plots/memory.png tb profile_trace/iteration_2/rank0_trace.json \
           memory_snapshot/iteration_2/rank0_memory_snapshot.json memory_snapshot/iteration_2/rank0_memory_snapshot.png; do
    [[ -e $tmp/outputs/main/$f ]] || fail "the main job's run lacks outputs/main/$f"
  done
}

# ---- the code blocks -----------------------------------------------------------------------------
# Drops a comment (a # at the start or after a blank, outside quotes).
strip_comment() {
  local s=$1 out="" q="" c prev=" " i
  for ((i = 0; i < ${#s}; i++)); do
    c=${s:i:1}
    if [[ -n $q ]]; then [[ $c == "$q" ]] && q=""
    elif [[ $c == "'" || $c == '"' ]]; then q=$c
    elif [[ $c == "#" && ( $prev == " " || $prev == $'\t' ) ]]; then break
    fi
    out+=$c; prev=$c
  done
  sed 's/[[:space:]]*$//' <<<"$out"
}

run_command() {
  local cmd=$1
  split_words "$cmd" || { fail "cannot read: $cmd"; return; }
  ((${#words[@]})) || return
  envs=()
  while ((${#words[@]})) && [[ ${words[0]} =~ ^[A-Za-z_][A-Za-z0-9_]*= ]]; do envs+=("${words[0]}"); words=("${words[@]:1}"); done
  local prog=${words[0]}
  case $prog in
    build/titan|titan) titan_cmd "" "${words[@]:1}" ;;
    mpirun) mpirun_cmd "${words[@]:1}" ;;
    srun) srun_cmd "${words[@]:1}" ;;
    scripts/*.sh|bench/*.sh|tests/*.sh) script_cmd "$prog" "${words[@]:1}" ;;
    cd) [[ -d $tmp/$cwd/${words[1]} ]] || { fail "no folder ${words[1]}"; return; }
        cwd=$cwd/${words[1]}; ok "cd ${words[1]}" ;;
    ctest) run_real "ctest -N ${words[*]:1}" ctest -N "${words[@]:1}" ;;
    ls) run_real "$cmd" "${words[@]}" ;;
    printf|echo) run_real "$cmd" bash -c "$cmd" ;;
    *) fail "unknown program '$prog' in: $cmd" ;;
  esac
}

line=0 in_block=0 shell=0 pending="" start=0
while IFS= read -r text || [[ -n $text ]]; do
  line=$((line + 1))
  if [[ $text =~ ^\`\`\`(.*)$ ]]; then
    if ((in_block)); then in_block=0; continue; fi
    in_block=1
    case ${BASH_REMATCH[1]} in ""|bash|sh|shell) shell=1 ;; *) shell=0 ;; esac
    continue
  fi
  ((in_block && shell)) || continue
  [[ -z $pending ]] && start=$line
  text=$(strip_comment "$text")
  if [[ $text == *\\ ]]; then pending+="${text%\\} "; continue; fi
  full="$pending$text"; pending=""
  [[ -z ${full// /} ]] && continue
  saved=$line; line=$start; cwd=.
  # a && b && c: each part in turn, a `cd` carrying over to the parts after it
  rest=$full
  while [[ -n $rest ]]; do
    part=${rest%%&&*}
    [[ $part == "$rest" ]] && rest="" || rest=${rest#*&&}
    run_command "$(sed 's/^ *//; s/ *$//' <<<"$part")"
  done
  line=$saved
done <"$readme"

# ---- names outside the blocks --------------------------------------------------------------------
line=0
while IFS= read -r text; do
  line=$((line + 1))
  # links to files of the repository
  while read -r target; do
    [[ -z $target || $target == http* || $target == \#* ]] && continue
    [[ -e $root/${target%%#*} ]] || fail "link to a missing file: $target"
  done < <(grep -o '](\([^)]*\))' <<<"$text" | sed 's/^](//; s/)$//')
  # repository paths and subcommands and config keys in backticks
  while read -r code; do
    [[ -z $code ]] && continue
    [[ $code =~ \.(jsonl|json|toml|png|md|txt|sh)$ ]] && code_is_file=1 || code_is_file=0
    for p in $(grep -oE '(^|[ (])(configs|scripts|docs|bench|tests|src)/[A-Za-z0-9_./-]+' <<<"$code" | sed 's/^[ (]//'); do
      [[ -e $root/$p ]] || fail "names a missing file: $p"
    done
    if [[ $code =~ ^titan\ ([a-z]+) ]]; then
      "$titan" "${BASH_REMATCH[1]}" --help >/dev/null 2>&1 || fail "titan has no command '${BASH_REMATCH[1]}'"
    fi
    ((code_is_file)) || for k in $(grep -oE '^(--)?(job|model|training|optimizer|lr_scheduler|parallelism|comm|checkpoint|activation_checkpoint|metrics|profiling|validation|dsa|fault|debug)\.[a-z_0-9]+' <<<"$code"); do
      k=${k#--}
      grep -q -- "--$k=" <<<"$train_help" || fail "names a config key titan train does not take: $k"
    done
  done < <(grep -o '`[^`]*`' <<<"$text" | tr -d '`')
done <"$readme"

echo "readme_commands_test: $ran commands ran, $checked checked without running, $fails failures"
((fails == 0))
