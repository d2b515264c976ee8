#!/usr/bin/env bash
# One accelerator lease's work for the recall issue (#33) and the cuDNN
# measurement left open in docs/benchmark.md, in the order that keeps the
# timings clean:
#   1. the cuDNN-vs-einsum cells of python -m experiments.device.devicecheck (GPU alone);
#   2. then, side by side on the GPU (each its own process, float32 at
#      'highest' matmul precision, as on a CPU):
#      - every recurrent mixer on MQAR `small` 64:8 at width 128 with 12x the
#        grid's 500 steps (6,000, cosine), lr 1e-3 (Zoology's default),
#      - Mamba in Zoology's block on 8 pairs with the 20,000-step schedule
#        that made it recall 4 pairs on the CPU (experiments/mqar/README.md),
#      - the S5 paper's Pathfinder-32 recipe (configs/s5_reference.py),
#   all stopped with SIGINT at the deadline (each keeps its checkpoint and
#   its validation curve in metrics.jsonl).
# Usage (repo root): bash experiments/device/session.sh OUT_DIR TOTAL_SECONDS
# Environment: MIXERS (default: the nine recurrent mixers), WIDTH (128;
# another width writes runs/gpu/mqar_long_wWIDTH), LRS (learning rates,
# commas: 1e-3), MQAR_STEPS (6000), EXTRA (more --config flags for the
# mixers' runs, with TAG naming their folder runs/gpu/mqar_long_TAG, e.g.
# TAG=lti EXTRA=--config.model.attention.selective=false), ZOO=0 / PF=0
# (leave out the Zoology-block Mamba run / the S5 Pathfinder run), GRID
# (e.g. 64:8: experiments/mqar/README.md's width x learning-rate grid at that
# length:pairs with --jobs JOBS (12), GRID_STEPS (500), GRID_MODELS,
# GRID_SPLITS; with MIXERS= ZOO=0 PF=0 it has the GPU to itself; carry
# runs/gpu back in the next lease to resume it: finished runs are
# skipped), CHECK_S (the devicecheck's budget, 120;
# 1 skips it), TAIL_S (seconds kept after the deadline, 45). Run again on a
# warm machine, it resumes every run from its checkpoint.
# Writes OUT_DIR/runs.tgz (every run's metrics, results and sweep.json, no
# checkpoints) and OUT_DIR/log.txt.
set -u
OUT=${1:?OUT_DIR}
TOTAL=${2:-480}
T0=$(date +%s)
left() { echo $((TOTAL - ($(date +%s) - T0))); }
mkdir -p "$OUT" runs/gpu
exec > >(tee -a "$OUT/log.txt") 2>&1
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
python3 -c "import jax, flax, optax; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, jax.devices())" || exit 3
# Pathfinder-32 images for the S5 recipe, generated beside the checks.
PREP=
if [ "${PF:-1}" = 1 ]; then
  timeout $((TOTAL - 120)) python3 -m lra.data.prepare pathfinder --option workers=6 \
    > runs/gpu/log_pf_prepare.txt 2>&1 &
  PREP=$!
fi
# Smoke: one tiny MQAR training on the device; stop here if it fails.
timeout 120 python3 train.py --config configs/mqar.py:mamba,smoke \
  --workdir runs/gpu/smoke > "$OUT/smoke.txt" 2>&1 || { tail -30 "$OUT/smoke.txt"; exit 4; }
echo "smoke ok, $(left) s left"

# 1. cuDNN against einsum (bfloat16, Text paper width), GPU alone.
python3 -m experiments.device.devicecheck --out runs/gpu/devicecheck \
  --sections fused_vs_einsum --budget_s "${CHECK_S:-120}" ${CHECK_ARGS:-}
echo "devicecheck done, $(left) s left"

# 2. The training runs, side by side until the deadline.
DEADLINE=$(( $(left) - ${TAIL_S:-45} )); T1=$(date +%s)
export XLA_PYTHON_CLIENT_PREALLOCATE=false JAX_DEFAULT_MATMUL_PRECISION=highest
STEPS=${MQAR_STEPS:-6000}
pids=()
for M in ${MIXERS-mamba s4d s5 retnet mamba2 h3 hyena gla deltanet}; do
  timeout -s INT -k 20 "$DEADLINE" python3 -m lra.sweep.main --tasks mqar \
    --preset small --out "runs/gpu/mqar_long${WIDTH:+_w$WIDTH}${TAG:+_$TAG}/$M" --models "$M" \
    --grid learning_rate="${LRS:-1e-3}" --config.model.emb_dim="${WIDTH:-128}" \
    --config.num_train_steps="$STEPS" --config.eval_every_steps=500 \
    --config.checkpoint_every_steps=500 --config.data.test_splits=64:4,64:16 \
    ${EXTRA:-} > "runs/gpu/log_$M${TAG:+_$TAG}.txt" 2>&1 &
  pids+=($!)
done
if [ -n "${GRID:-}" ]; then
  GL=${GRID%:*}; GP=${GRID#*:}
  timeout -s INT -k 30 "$DEADLINE" python3 -m lra.sweep --tasks mqar \
    --preset small --out "runs/gpu/grid_${GL}x${GP}" --jobs "${JOBS:-12}" \
    --models "${GRID_MODELS:-transformer,based,gla,deltanet,linear_transformer,local,performer,reformer,bigbird,s4d,retnet,s5,h3,hyena,mamba2,mamba}" \
    --grid model.emb_dim=128,64,32 \
    --grid learning_rate=1e-4,3.2e-4,1e-3,3.2e-3,1e-2,3.2e-2 \
    --config.data.seq_len="$GL" --config.data.num_kv_pairs="$GP" \
    --config.num_train_steps="${GRID_STEPS:-500}" \
    ${GRID_SPLITS:+--config.data.test_splits=$GRID_SPLITS} \
    > "runs/gpu/log_grid_${GL}x${GP}.txt" 2>&1 &
  pids+=($!)
fi
if [ "${ZOO:-1}" = 1 ]; then
  timeout -s INT -k 20 "$DEADLINE" python3 -m lra.sweep.main --tasks mqar \
    --preset small --out runs/gpu/mqar_long/mamba_zoo8 --models mamba \
    --grid learning_rate=1e-3 --config.model.emb_dim=128 \
    --config.model.block=ssm --config.model.short_conv=0 \
    --config.weight_decay=0.1 --config.warmup_steps=0 \
    --config.num_train_steps=20000 --config.eval_every_steps=500 \
    --config.checkpoint_every_steps=500 --config.data.test_splits=64:4,64:16 \
    > runs/gpu/log_mamba_zoo8.txt 2>&1 &
  pids+=($!)
fi
if [ -n "$PREP" ]; then wait "$PREP"; echo "pathfinder data: exit $?, $(left) s left"; fi
PF_S=$(( DEADLINE - ($(date +%s) - T1) ))
if [ "${PF:-1}" = 1 ] && [ "$PF_S" -gt 60 ]; then
  timeout -s INT -k 20 "$PF_S" python3 train.py \
    --config configs/pathfinder.py:s5 --workdir runs/gpu/pf_s5_ref \
    --config.eval_every_steps=500 --config.checkpoint_every_steps=500 \
    > runs/gpu/log_pf_s5.txt 2>&1 &
  pids+=($!)
fi
sleep 60; nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv || true
wait "${pids[@]}"
echo "trainings stopped, $(left) s left"
for f in runs/gpu/log_*.txt; do echo "== $f"; tail -c 600 "$f" | tr '\r' '\n' | tail -4; done
tar czf "$OUT/runs.tgz" --exclude='checkpoints' --exclude='*.ckpt' \
  --exclude='ckpt*' runs/gpu 2>/dev/null
ls -la "$OUT"
