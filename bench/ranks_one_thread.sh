# Sourced by the pipeline benches: the environment of ranks of one OpenMP thread each under
# mpirun as root on a shared machine (every rank may share a core), the repository root ($root)
# and the build folder ($build: the script's first argument, default build/), shifted off.
root=$(cd "$(dirname "${BASH_SOURCE[1]}")/.." && pwd)
build=${1:-$root/build}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE OMP_PROC_BIND=false
cd "$root"
echo "host: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc --all) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
