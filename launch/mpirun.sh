#!/usr/bin/env bash
# Launches a shardckpt program under OpenMPI's mpirun with what it needs on one host or many:
#   launch/mpirun.sh -np 4 build/bin/shardckpt-train --ckpt /tmp/run --steps 40
#   launch/mpirun.sh -np 16 --hostfile hosts build/bin/shardckpt-train ...
#   launch/mpirun.sh --bind-to none -np 4 -x OMP_NUM_THREADS build/bin/shardckpt-train ...
# * as root, adds --allow-run-as-root (containers); as any other user, nothing;
# * with more ranks than cores on one host, adds --oversubscribe;
# * passes SHARDCKPT_* variables (log level, failpoints) to every rank;
# * forwards a stop request to every rank: SIGTERM or SIGUSR1 sent to this script reaches each
#   rank, on every host, as SIGUSR1, and the job's exit status is the ranks' (the trainer saves
#   the step it agreed on and exits 0). A second SIGTERM, a second or more after the first, ends
#   the job at once (mpirun's own SIGTERM handling). Ctrl-C (SIGINT) and SIGHUP are passed to
#   mpirun once, which aborts the job as before; Ctrl-Z and fg (SIGTSTP, SIGCONT) pause and
#   resume the ranks.
# * runs mpirun in a session of its own, so that a signal sent to this script's whole process
#   group (`timeout`, `kill -TERM -PGID`, Slurm signalling every process of a batch script that
#   calls this one, a terminal's Ctrl-C) reaches mpirun only as this script passes it on: a
#   SIGTERM that reached mpirun directly aborted the job within a second, without the final
#   checkpoint, and mpirun returned while the ranks still ran (measured with `timeout`). A
#   terminal's Ctrl-C that reached mpirun twice (directly and passed on) made it exit at once.
# * ends the job when this script is killed (SIGKILL, which it cannot trap; `timeout -k`): mpirun
#   gets SIGTERM and aborts the job, so no rank is left running (util-linux's setpriv).
# Why not plain `exec mpirun`: OpenMPI 4's mpirun treats SIGTERM (and SIGINT, SIGHUP) as "abort
# the job": each rank gets SIGTERM, then SIGKILL one second later (odls_base_sigkill_timeout), and
# mpirun exits 1 (measured with 4.1.4; raising that timeout only delays the kill). SIGUSR1 and
# SIGUSR2 it forwards to every rank and otherwise ignores (ess_base_forward_signals; SIGTERM
# cannot be added to that list), so a graceful stop has to arrive at mpirun as SIGUSR1.
# Inside the program, rank and size come from MPI itself; launch/rank_env.sh shows the
# OpenMPI, PMI and Slurm variables a wrapper script can read before MPI starts.
set -euo pipefail
. "$(dirname "$0")/usage.sh"
args=()
np=1
hostfile=""
# mpirun's own options come first, in any order; the program is the first word that is not one
# of them. Options not named here are passed on as flags without a value.
while [ $# -gt 0 ]; do
  case "$1" in
    -np|-n|--np|--n|-c) np=$2; args+=("$1" "$2"); shift 2 ;;
    -np=*|-n=*|--np=*|--n=*|-c=*) np=${1#*=}; args+=("${1%%=*}" "$np"); shift ;;
    --hostfile|-hostfile|--machinefile|-machinefile|-H|--host|-host) hostfile=$2; args+=("$1" "$2"); shift 2 ;;
    --hostfile=*|--machinefile=*|--host=*) hostfile=${1#*=}; args+=("$1"); shift ;;
    --mca|-mca|--gmca|-gmca) args+=("$1" "$2" "$3"); shift 3 ;;
    -x|--bind-to|-bind-to|--map-by|-map-by|--rank-by|-rank-by|--rankfile|-rf|--npernode|-npernode|-N|--npersocket|\
      --output-filename|--prefix|--wdir|-wdir|--tune|--cpu-set|--cpus-per-proc|--report-bindings-file)
      args+=("$1" "$2"); shift 2 ;;
    --) shift; break ;;
    -*) args+=("$1"); shift ;;
    *) break ;;
  esac
done
[ "$(id -u)" -eq 0 ] && args+=(--allow-run-as-root)
if [ -z "$hostfile" ] && [ "$np" -gt "$(nproc)" ]; then args+=(--oversubscribe); fi
for v in $(env | grep -o '^SHARDCKPT_[A-Z_]*' || true); do args+=(-x "$v"); done

# A log pipe whose reader died with the rest of the process group (`... | tee log` under
# `timeout` or Slurm) must not end this script (SIGPIPE on its message) or mpirun before the
# stop request is passed on and the ranks have saved: writes there fail instead.
trap '' PIPE
# stdin explicitly: a background job would get /dev/null. setsid execs mpirun (this background
# child leads no process group), so $! is mpirun's pid; should it have to fork (a shell with job
# control), -w still makes $! end with mpirun, with its status.
# Its own session keeps mpirun out of a SIGKILL sent to this script's group (`timeout -k`,
# `kill -9 -PGID`) or to this script alone: the job ran on to its end, committing checkpoints a
# requeued job then collided with. setpriv's parent-death signal (kept across both execs) sends
# mpirun SIGTERM when this script dies: mpirun aborts the job, as a hard kill of it asks.
pdeath=()
if setpriv --pdeathsig TERM true 2> /dev/null; then pdeath=(setpriv --pdeathsig TERM); fi
"${pdeath[@]}" setsid -w mpirun "${args[@]}" "$@" <&0 &
job=$!
first_term=""  # when the first SIGTERM came, in microseconds
stop() {  # $1: the signal this script received
  if [ "$1" = TERM ]; then
    local now=${EPOCHREALTIME/[.,]/}
    if [ -n "$first_term" ]; then
      # Within a second of the first it is the same request delivered twice: `timeout` signals
      # this script and then its whole process group, this script included.
      [ $((now - first_term)) -lt 1000000 ] && return
      kill -TERM "$job" 2> /dev/null || true
      echo "launch/mpirun.sh: second SIGTERM: ending the job now" >&2 2> /dev/null
      return
    fi
    first_term=$now
  fi
  kill -USR1 "$job" 2> /dev/null || true  # first: stderr may be a pipe nobody reads any more
  echo "launch/mpirun.sh: SIG$1: asking every rank to stop (forwarded as SIGUSR1)" >&2 2> /dev/null
}
trap 'stop TERM' TERM
trap 'stop USR1' USR1
trap 'kill -INT "$job" 2> /dev/null || true' INT
trap 'kill -HUP "$job" 2> /dev/null || true' HUP
# Ctrl-Z and fg: mpirun passes SIGTSTP and SIGCONT on to the ranks; this script stops itself too,
# so the shell sees the job stopped, and once continued (fg) continues mpirun. Not a CONT trap:
# bash 5.2 then drops a TERM trap when SIGCONT follows at once, as coreutils `timeout` sends them,
# and the job would run on to its end without its final checkpoint.
trap 'kill -TSTP "$job" 2> /dev/null || true; kill -STOP $$; kill -CONT "$job" 2> /dev/null || true' TSTP
# `wait` returns early (status > 128) whenever a trapped signal arrives: wait again while mpirun
# runs, then once more for its own status (bash keeps it for a child already reaped).
set +e
while kill -0 "$job" 2> /dev/null; do wait "$job"; done
wait "$job"
