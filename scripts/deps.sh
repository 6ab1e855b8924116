#!/usr/bin/env bash
# Debian packages the tests use beyond the toolchains, installed when missing (CI starts from
# a machine with only the toolchains): fio (exports of the I/O model are parsed by it),
# chromium (HTML reports are loaded in it, headless), OpenMPI with mpi4py (MPI ranks write
# a collective output, python/examples/collective_mpi.py), iptables (the emulated hosts'
# delay line, on kernels without netem: crates/hosts), and SLURM with munge
# (scripts/test-slurm.sh).
set -euo pipefail
want=()
command -v fio >/dev/null || want+=(fio)
command -v chromium >/dev/null || want+=(chromium)
command -v mpirun >/dev/null || want+=(openmpi-bin)
[ -d /usr/lib/python3/dist-packages/mpi4py ] || want+=(python3-mpi4py)
command -v iptables >/dev/null || want+=(iptables)
command -v sbatch >/dev/null && command -v slurmctld >/dev/null && command -v slurmd >/dev/null &&
  command -v munged >/dev/null || want+=(slurm-wlm munge)
if [ ${#want[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q "${want[@]}" >/dev/null 2>&1 ||
    { apt-get update -q >/dev/null && apt-get install -y -q "${want[@]}" >/dev/null; }
fi
