#!/usr/bin/env bash
# mpirun with what Open MPI needs here and nobody should have to remember: permission to run as
# root (containers and CI run as root), oversubscription when more ranks than cores are asked
# for, and no binding of its own (each rank binds its threads to its share of the host's cores;
# Open MPI's default binds ranks to a core or a whole socket). See README "Several ranks".
#   scripts/mpirun.sh -np 4 build/titan train --config configs/llama3_debug.toml --parallelism.data_parallel_shard_degree=4
set -euo pipefail
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export OMPI_MCA_rmaps_base_oversubscribe=${OMPI_MCA_rmaps_base_oversubscribe:-1}
exec mpirun --bind-to none "$@"
