#!/usr/bin/env bash
# The reference queue on an accelerator lease (issue 48): the command a
# session with a lease passes to the device tool as it is, before any other
# device work.
#
#   bash experiments/reference/lease.sh SECONDS [LEASE_SECONDS]
#
# SECONDS: this call's seconds (the run's timeout_s less about 30, for the
# start-up of this script and the transfers). LEASE_SECONDS (default
# SECONDS): the seconds left in the lease, this call included; a ListOps run
# (its checkpoint is too big to travel) starts when it fits them, and a
# second call on the same warm machine resumes it from runs/reference/.
#
# Installs the wheels carried in .whl/ when there are any (the image has jax
# 0.11.2, on which flax 0.12.8 does not import and 0.12.12 does, and no
# ml_collections: experiments/reference/README.md says how to fetch them),
# checks that the packages import and see the GPU, then runs
# `python -m experiments.reference.queue` with the seconds left. Leaves
# $OUT/archive.tgz (the archive experiments/reference/archive, to unpack and
# commit) and $OUT/queue_log.txt (OUT: the device tool's; else
# runs/reference_out).
set -u
T0=$(date +%s)
BUDGET=${1:?usage: bash experiments/reference/lease.sh SECONDS [LEASE_SECONDS]}
LEASE=${2:-$BUDGET}
DEST=${OUT:-runs/reference_out}
mkdir -p "$DEST"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target /tmp/site .whl/*.whl || exit 3
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader \
  || true
python3 -c 'import jax, flax, optax, orbax.checkpoint, ml_collections
print("jax", jax.__version__, "flax", flax.__version__, jax.devices())' || {
  echo 'error: the packages do not import; carry .whl (experiments/reference/README.md).'
  exit 3
}
USED=$(($(date +%s) - T0))
python3 -m experiments.reference.queue --budget $((BUDGET - USED)) \
  --lease $((LEASE - USED)) --tarball "$DEST/archive.tgz" 2>&1 \
  | tee "$DEST/queue_log.txt"
exit "${PIPESTATUS[0]}"
