r"""Image (LRA): CIFAR-10 as a sequence of 1,024 gray pixels, 10 classes.

Run:
  python -m lra.data.prepare image   # once; needs cifar-10-python.tar.gz
  python train.py --config configs/image.py:transformer --workdir runs/image
  python train.py --config configs/image.py:transformer,small --workdir runs/s

Self-pretraining (configs/base.py apply_spt; Amos, Berant and Gupta, "Never
Train from Scratch"): pretrain on the task's own inputs with masked_lm, then
fine-tune from its encoder, two commands:
  python train.py --config configs/image.py:transformer,small_spt \
    --workdir runs/spt
  python train.py --config configs/image.py:transformer,small \
    --workdir runs/ft --config.init_from=runs/spt
or both: python -m lra.sweep --tasks image --models transformer \
    --preset small_spt --out runs/x

Reference values: the reference harness's final
lra_benchmarks/image/configs/cifar10/base_cifar10_config.py (batch 256, Adam
0.9/0.98/1e-9, no weight decay, lr 0.0005 x linear warmup 175 x cosine decay,
35,000 steps = 200 epochs of 45,000 images, emb 32, qkv 32, mlp 64, 1 head,
1 layer, CLS pooling, dropout 0.3 / attention dropout 0.2, learned
positions, evaluation every epoch), then each model's tuned architecture
from its <model>_base.py (MODEL_OVERRIDES below). Splits as the reference's
TFDS `train[:90%]` / `train[90%:]` / `test`; gray levels as its
tf.image.rgb_to_grayscale (lra/data/image.py). Fixed here: black pixels (0) are
pixels, not padding (the reference masked them out of attention;
--config.data.black_is_padding=true restores that).

Paper test accuracy (LRA Table 1, %): transformer 42.44, local 41.46,
sparse_transformer 44.24, longformer 42.22, linformer 38.56, reformer 38.07,
sinkhorn 41.23, synthesizer 41.61, bigbird 40.83, linear_transformer 42.34,
performer 42.77.

Presets:
  small: the whole image, 64-wide, 1 layer, batch 32, about 1 epoch in about
    10 minutes on 2 CPU cores; clearly above chance (10%).
  small_spt: `small,spt`: the `small` model, schedule and steps with
    objective masked_lm (labels unused); the fine-tune is `small` with
    --config.init_from. `spt` alone pretrains the reference configuration;
    smoke_spt is `smoke,spt`.
  smoke: a few seconds, for tests (reads the same release files; the model
    sees the first 64 pixels only).

dtype: on a GPU or TPU, add --config.dtype=bfloat16 as the default there
(activations and matmuls in bfloat16; parameters, softmax, normalisers and
the loss stay float32, models/). CPU runs keep the config's float32.
"""

from configs import base, models

# Each model's tuned settings (the reference's <model>_base.py configs;
# lra/reference/lra_configs.md), applied by models.apply_model after the
# values above and before the presets: flattened config keys.
MODEL_OVERRIDES = {
  'transformer': {
    'model.num_layers': 1,
    'model.num_heads': 8,
    'model.emb_dim': 128,
    'model.qkv_dim': 64,
    'model.mlp_dim': 128,
    'model.pooling': 'cls',
  },
  # The reference's bigbird misspelt num_heads (its run used 1 head); we use
  # the 4 it asked for.
  'bigbird': {
    'model.num_layers': 1,
    'model.num_heads': 4,
    'model.emb_dim': 128,
    'model.qkv_dim': 64,
    'model.mlp_dim': 128,
    'model.pooling': 'cls',
    'model.attention.block_size': 64,
  },
  'linear_transformer': {
    'model.num_layers': 1,
    'model.num_heads': 8,
    'model.emb_dim': 128,
    'model.qkv_dim': 64,
    'model.mlp_dim': 128,
    'model.pooling': 'cls',
  },
  'linformer': {
    'model.num_layers': 1,
    'model.num_heads': 8,
    'model.emb_dim': 128,
    'model.qkv_dim': 64,
    'model.mlp_dim': 128,
    'model.pooling': 'cls',
  },
  'local': {
    'model.num_layers': 1,
    'model.num_heads': 2,
    'model.emb_dim': 128,
    'model.qkv_dim': 64,
    'model.mlp_dim': 128,
    'model.pooling': 'mean',
    'model.attention.block_size': 64,
  },
  'longformer': {
    'model.num_layers': 4,
    'model.num_heads': 4,
    'model.emb_dim': 128,
    'model.qkv_dim': 64,
    'model.mlp_dim': 128,
    'model.pooling': 'mean',
  },
  'performer': {
    'model.num_layers': 1,
    'model.num_heads': 8,
    'model.emb_dim': 128,
    'model.qkv_dim': 64,
    'model.mlp_dim': 128,
    'model.pooling': 'cls',
  },
  'reformer': {
    'model.num_layers': 4,
    'model.num_heads': 8,
    'model.emb_dim': 64,
    'model.qkv_dim': 32,
    'model.mlp_dim': 64,
    'model.pooling': 'cls',
  },
  'sparse_transformer': {
    'model.num_layers': 1,
    'model.num_heads': 8,
    'model.emb_dim': 128,
    'model.qkv_dim': 64,
    'model.mlp_dim': 128,
    'model.pooling': 'cls',
  },
  'synthesizer': {
    'model.num_layers': 1,
    'model.num_heads': 8,
    'model.emb_dim': 128,
    'model.qkv_dim': 64,
    'model.mlp_dim': 128,
    'model.pooling': 'cls',
  },
  # Sinkhorn: the base architecture above with these changes.
  'sinkhorn': {
    'model.num_layers': 1,
    'model.attention.block_size': 64,
    'weight_decay': 0.7,
    'model.dropout_rate': 0.1,
  },
}


def get_config(arg=None):
  model_name, presets = base.parse_arg(arg)
  c = base.get_base_config()
  c.task = 'image'
  # Where to read CIFAR-10 from: 'auto' (the first found of the next three),
  # 'archive' (<data_dir>/image/cifar-10-python.tar.gz), 'folders'
  # (cifar-10-batches-py/ there, unpacked) or 'tfds' (TFDS's prepared
  # cifar10 in $TFDS_DATA_DIR, ~/tensorflow_datasets or
  # <data_dir>/image/tensorflow_datasets). The validation images depend on
  # the source's order.
  c.data.source = 'auto'
  # True reproduces the reference, which treated black pixels (0) as padding:
  # masked out of attention (key padding) and out of mean/max pooling. False
  # (ours): every pixel is a real token.
  c.data.black_is_padding = False
  c.max_length = 1024
  c.batch_size = 256
  c.num_train_steps = 35000
  c.eval_every_steps = 175
  c.checkpoint_every_steps = 1750
  c.learning_rate = 0.0005
  c.schedule = 'cosine'
  c.warmup_steps = 175
  c.weight_decay = 0.0
  c.model.num_layers = 1
  c.model.emb_dim = 32
  c.model.qkv_dim = 32
  c.model.num_heads = 1
  c.model.mlp_dim = 64
  c.model.dropout_rate = 0.3
  c.model.attention_dropout_rate = 0.2
  c.model.pooling = 'cls'
  c.model.positions = 'learned'
  models.apply_model(c, model_name, MODEL_OVERRIDES)

  if 'small' in presets:
    c.batch_size = 32
    base.apply_small(
      c,
      num_train_steps=1500,
      warmup_steps=100,
      weight_decay=0.0,
      num_layers=1,
      emb_dim=64,
      num_heads=2,
      mlp_dim=128,
      dropout_rate=0.1,
    )
  if 'smoke' in presets:
    base.apply_smoke(c)
  return base.finalize(c, presets)
