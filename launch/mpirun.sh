#!/usr/bin/env bash
# Launches a shardckpt program under OpenMPI's mpirun with what it needs on one host or many:
#   launch/mpirun.sh -np 4 build/bin/shardckpt-train --ckpt /tmp/run --steps 40
#   launch/mpirun.sh -np 16 --hostfile hosts build/bin/shardckpt-train ...
# * as root, adds --allow-run-as-root (containers); as any other user, nothing;
# * with more ranks than cores on one host, adds --oversubscribe;
# * passes SHARDCKPT_* variables (log level, failpoints) to every rank.
# Inside the program, rank and size come from MPI itself; launch/rank_env.sh shows the
# OpenMPI, PMI and Slurm variables a wrapper script can read before MPI starts.
set -euo pipefail
args=()
np=1
hostfile=""
while [ $# -gt 0 ]; do
  case "$1" in
    -np|-n) np=$2; args+=("$1" "$2"); shift 2 ;;
    --hostfile|-hostfile) hostfile=$2; args+=("$1" "$2"); shift 2 ;;
    *) break ;;
  esac
done
[ "$(id -u)" -eq 0 ] && args+=(--allow-run-as-root)
if [ -z "$hostfile" ] && [ "$np" -gt "$(nproc)" ]; then args+=(--oversubscribe); fi
for v in $(env | grep -o '^SHARDCKPT_[A-Z_]*' || true); do args+=(-x "$v"); done
exec mpirun "${args[@]}" "$@"
