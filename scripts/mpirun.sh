#!/usr/bin/env bash
# mpirun with what Open MPI needs here and nobody should have to remember: permission to run as
# root (containers and CI run as root), and oversubscription when more ranks than cores are asked
# for (each rank then takes one core's share; see README "Several ranks").
#   scripts/mpirun.sh -np 4 build/titan train --config configs/llama3_debug.toml --parallelism.data_parallel_shard_degree=4
set -euo pipefail
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export OMPI_MCA_rmaps_base_oversubscribe=${OMPI_MCA_rmaps_base_oversubscribe:-1}
exec mpirun "$@"
