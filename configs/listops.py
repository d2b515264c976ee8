r"""ListOps (LRA): 10-way classification of nested list operations.

Run:
  python train.py --config configs/listops.py:transformer --workdir runs/listops
  python train.py --config configs/listops.py:transformer,small --workdir runs/s

Self-pretraining (configs/base.py apply_spt; Amos, Berant and Gupta, "Never
Train from Scratch"): pretrain on the task's own inputs with masked_lm, then
fine-tune from its encoder, two commands:
  python train.py --config configs/listops.py:transformer,small_spt \
    --workdir runs/spt
  python train.py --config configs/listops.py:transformer,small \
    --workdir runs/ft --config.init_from=runs/spt
or both: python -m lra.sweep --tasks listops --models transformer \
    --preset small_spt --out runs/x

Reference values: the reference harness's final
lra_benchmarks/listops/configs/base_listops_config.py (batch 32, Adam 0.9/0.98/
1e-9, weight decay 0.1, lr 0.05 x linear warmup 1000 x rsqrt decay, 5,000
steps, emb 512, qkv 512, mlp 1024, 8 heads, 4 layers, max length 2000 + CLS,
CLS pooling, dropout 0.1 / attention dropout 0.1, sinusoidal positions).
Fixed here: the vocabulary is a fixed documented list (the reference built it
in Python-hash order), so checkpoints and caches are portable.

Paper test accuracy (LRA Table 1, %): transformer 36.37, local 15.82,
sparse_transformer 17.07, longformer 35.63, linformer 35.70, reformer 37.27,
sinkhorn 33.67, synthesizer 36.99, bigbird 36.05, linear_transformer 16.13,
performer 18.01.

Presets:
  small: 128-wide, 2 layers, trees of 16-200 tokens (depth <= 6), 30k train
    examples, 1,000 steps, about 5 minutes on 2 CPU cores; test 37.7%
    (majority class 15.3%).
  small_spt: `small,spt`: the `small` model, schedule and steps with
    objective masked_lm (labels unused); the fine-tune is `small` with
    --config.init_from. `spt` alone pretrains the reference configuration;
    smoke_spt is `smoke,spt`.
  smoke: a few seconds, for tests.

dtype: on a GPU or TPU, add --config.dtype=bfloat16 as the default there
(activations and matmuls in bfloat16; parameters, softmax, normalisers and
the loss stay float32, models/). CPU runs keep the config's float32.
"""

from configs import base, models


def get_config(arg=None):
  model_name, presets = base.parse_arg(arg)
  c = base.get_base_config()
  c.task = 'listops'
  # 'full' (LRA: 96k/2k/2k, 500 < tokens < 2000), 'small' or 'smoke'.
  c.data.variant = 'full'
  c.max_length = 2000
  c.batch_size = 32
  c.num_train_steps = 5000
  c.eval_every_steps = 500
  c.checkpoint_every_steps = 500
  c.learning_rate = 0.05
  c.schedule = 'rsqrt'
  c.warmup_steps = 1000
  c.weight_decay = 0.1
  models.apply_model(c, model_name)

  if 'small' in presets:
    c.data.variant = 'small'
    c.max_length = 200
    base.apply_small(
      c,
      num_train_steps=1000,
      warmup_steps=100,
      num_layers=2,
      emb_dim=128,
      num_heads=4,
      mlp_dim=256,
      dropout_rate=0.0,
      eval_every_steps=250,
    )
  if 'smoke' in presets:
    c.data.variant = 'smoke'
    base.apply_smoke(c)
  return base.finalize(c, presets)
