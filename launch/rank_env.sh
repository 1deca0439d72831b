#!/usr/bin/env bash
# Prints this process's rank and world size as the launcher sees them: OpenMPI (mpirun),
# PMI/PMIx (srun --mpi=pmix, MPICH hydra) or Slurm. Source it or run it inside a rank.
rank=${OMPI_COMM_WORLD_RANK:-${PMIX_RANK:-${PMI_RANK:-${SLURM_PROCID:-0}}}}
size=${OMPI_COMM_WORLD_SIZE:-${PMI_SIZE:-${SLURM_NTASKS:-1}}}
local_rank=${OMPI_COMM_WORLD_LOCAL_RANK:-${MPI_LOCALRANKID:-${SLURM_LOCALID:-0}}}
echo "rank=$rank size=$size local_rank=$local_rank"
