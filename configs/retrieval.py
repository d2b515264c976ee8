r"""Retrieval (LRA): do two AAN papers cite each other? Byte level.

Run:
  python -m lra.data.prepare retrieval   # once; needs the LRA release's tsv_data
  python train.py --config configs/retrieval.py:transformer --workdir runs/r
  python train.py --config configs/retrieval.py:transformer,small \
    --workdir runs/s

Self-pretraining (configs/base.py apply_spt; Amos, Berant and Gupta, "Never
Train from Scratch"): pretrain on the task's own inputs with masked_lm, then
fine-tune from its encoder, two commands:
  python train.py --config configs/retrieval.py:transformer,small_spt \
    --workdir runs/spt
  python train.py --config configs/retrieval.py:transformer,small \
    --workdir runs/ft --config.init_from=runs/spt
or both: python -m lra.sweep --tasks retrieval --models transformer \
    --preset small_spt --out runs/x

Reference values: the reference harness's final
lra_benchmarks/matching/configs/base_match_config.py (batch 32, Adam 0.9/
0.98/1e-9, weight decay 0.1, lr 0.05 x linear warmup 8000 x rsqrt decay,
5,000 steps, emb 128, qkv 128, mlp 512, 4 heads, 4 layers, max length 4000
per document, CLS pooling, dropout 0.1 / attention dropout 0.1, sinusoidal
positions). As in the reference, warmup (8,000) outlasts training (5,000),
so the learning rate only ever rises. Fixed here: the two documents are
encoded separately by one shared encoder and classified from [u, v, u * v,
u - v], as the paper describes (the reference trainer built a single-input
encoder); the task's two inputs select the dual head, the reference's
classifier_head_dual: Dense(mlp) -> ReLU -> Dense(mlp / 2) -> ReLU ->
Dense(2). Changed here: each document gets a prepended CLS token, pooled
(as every other task's CLS pooling); the reference's dual encoder prepended
none and pooled the document's first byte: `--config.model.pooling=first`
does that. Validation is the release's eval file (18,090 pairs), every 500
steps (the reference: every 100).

Paper test accuracy (LRA Table 1, %): transformer 57.46, local 53.39,
sparse_transformer 59.59, longformer 56.89, linformer 52.27, reformer 53.40,
sinkhorn 53.83, synthesizer 54.67, bigbird 59.29, linear_transformer 53.09,
performer 53.82.

Presets:
  small: 1,024 bytes per document, 64-wide, 2 layers; learns slowly on a CPU
    (evaluating 18,090 pairs is the slow part), a GPU is better.
  small_spt: `small,spt`: the `small` model, schedule and steps with
    objective masked_lm (labels unused); the fine-tune is `small` with
    --config.init_from. `spt` alone pretrains the reference configuration;
    smoke_spt is `smoke,spt`.
  smoke: a few seconds, for tests (reads the same release files).

dtype: on a GPU or TPU, add --config.dtype=bfloat16 as the default there
(activations and matmuls in bfloat16; parameters, softmax, normalisers and
the loss stay float32, models/). CPU runs keep the config's float32.
"""

from configs import base, models


def get_config(arg=None):
  model_name, presets = base.parse_arg(arg)
  c = base.get_base_config()
  c.task = 'retrieval'
  # The release's new_aan_pairs.{train,eval,test}.tsv, under
  # <data_dir>/retrieval/ or <data_dir>/retrieval/tsv_data/; no options.
  c.max_length = 4000
  c.batch_size = 32
  c.num_train_steps = 5000
  c.eval_every_steps = 500
  c.checkpoint_every_steps = 500
  c.learning_rate = 0.05
  c.schedule = 'rsqrt'
  c.warmup_steps = 8000
  c.weight_decay = 0.1
  c.model.num_layers = 4
  c.model.emb_dim = 128
  c.model.qkv_dim = 128
  c.model.num_heads = 4
  c.model.mlp_dim = 512
  c.model.dropout_rate = 0.1
  c.model.attention_dropout_rate = 0.1
  c.model.pooling = 'cls'
  c.model.positions = 'sinusoidal'
  models.apply_model(c, model_name)

  if 'small' in presets:
    c.max_length = 1024
    base.apply_small(
      c,
      num_train_steps=2000,
      warmup_steps=200,
      eval_every_steps=1000,
      num_layers=2,
      emb_dim=64,
      num_heads=4,
      mlp_dim=128,
      dropout_rate=0.1,
    )
  if 'smoke' in presets:
    base.apply_smoke(c)
  return base.finalize(c, presets)
