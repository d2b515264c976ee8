r"""MQAR: multi-query associative recall (Zoology), a label per position.

Run:
  python train.py --config configs/mqar.py:transformer,small --workdir runs/mq
  python train.py --config configs/mqar.py:transformer --workdir runs/mqar
  python train.py --config configs/mqar.py:linformer,small \
    --workdir runs/mq_lin --config.data.form=bidirectional

The task (lra/data/mqar.py; Arora, Eyuboglu et al. 2023, "Zoology:
Measuring and Improving Recall in Efficient Language Models", arXiv
2312.04927): num_kv_pairs key-value pairs, then the keys asked again at
power-law gaps; the accuracy is over the queries only (objective
per_position, lra/train/objectives.py). data.form=causal is Zoology's
next-token form (a causal model; cores that cannot be causal stop with
their sentence), data.form=bidirectional puts a mask id in each answer slot
for encoders without a causal mask (Linformer, Sinkhorn). max_length is
data.seq_len (a reference: setting one sets both). data.test_splits
('256:16,512:32', seq_len:num_kv_pairs) adds test splits at other shapes,
reported per split in results.json `test_splits` (best checkpoint; a longer
split runs the model rebuilt at its length).

Reference values (no preset), Zoology's MQAR setting
(zoology/experiments/paper_configs/iclr24_zoology_figure2/configs.py and
zoology/data/multiquery_ar.py, github.com/HazyResearch/zoology): vocabulary
8,192; 100,000 training and 3,000 test examples per configuration (our
validation split of 1,000 is extra); power_a 0.01; 2 layers; width 128 (the
figure sweeps 64, 128, 256, 512; heads 1, as its attention); the figure's
grid is (seq_len, pairs) = (64, 4), (128, 8), (256, 16), (512, 64), with
Zoology's original MQAR configs training on 64..256 with 4..64 pairs and
testing up to (1024, 256): here (256, 16), batch 256 (the figure's at
length 256); AdamW (0.9, 0.999, eps 1e-8) with weight decay 0.1 (Zoology's
TrainConfig), cosine decay to 0 (Zoology's CosineAnnealingLR), lr 1e-3
(Zoology's default; the figure reports the best of 1e-4 .. 1e-2), 64 epochs
= 25,000 steps; dropout 0.1 on the embeddings and the attention weights,
none on the residual branches (Zoology's embed_dropout and MHA dropout,
resid_dropout 0); learned positions (the figure's attention models:
max_position_embeddings = seq_len); short_conv 0 (the figure's attention has
none; its original MQAR configs put a gated width-3 convolution before every
attention, which model.short_conv=3 approximates). Differences: our
TransformerBlock has its feed-forward (mlp_dim 256; Zoology's MQAR runs use
none, state_mixer Identity), noise tokens never take the id 0 (our padding
id), we have a validation split and no early stop at 99% validation
accuracy.

Presets:
  small: 2 layers, width 64, 2 heads, mlp 128, length 64, 8 pairs,
    vocabulary 256, 20,000 training examples, batch 64, lr 3e-3 (cosine,
    warmup 30), 500 steps (evaluated every 100), short_conv 2, no position
    embeddings (the causal mask and the convolution order the tokens;
    Zoology's original MQAR attention models have none either); extra test
    splits 64:4, 64:12 and 64:16 (more pairs at the training length: the x
    axis of python -m experiments.mqar.report's plot) and 128:16 (the model run at
    length 128). Sized for a sweep of every model on 2 CPU cores: measured
    here (seed 0, 2 cores shared with other jobs), the transformer's
    validation accuracy was 4.6%, 30.8%, 98.6%, 99.5% at steps 100-400 at
    lr 3e-3 and 25.3%, 98.6%, 98.8%, 98.8% at lr 1e-2, at 1.2-1.7 steps/s
    under a load of 10. The preset was length 128 with vocabulary 1,024
    and 1,000 steps before (test 99.62%, best at step 750, 446 s of CPU):
    about 3x the cost per step, and 600 steps gave 99.06% there.
    Cores sized for LRA's lengths are resized for 64
    (SMALL_MODEL_OVERRIDES: windows and blocks of 16, stride 8, bigbird
    blocks of 4, linformer projection 16, segments of 16); at their
    defaults they would equal softmax attention at this length.
  smoke: 1 layer, 16 wide, length 32, 4 pairs, vocabulary 64, short_conv 2,
    learned positions, test splits 16:2 and 64:8; seconds, for tests.
  zoology (this task's own; implies small's sizes): Zoology's figure-2
    block and recipe at small's sizes, `configs/mqar.py:<model>,zoology`
    (OUT/mqar/<model>-zoology in a sweep: `--preset zoology`): 4 pairs at
    length 64 (the figure's (64, 4)), test splits 64:8 and 64:16, the
    mixer alone in each block (model.block=ssm: norm, mixer, residual; no
    feed-forward, as Zoology's state_mixer Identity); mixers without
    short_conv and positions, attention cores with learned positions and
    short_conv 2 (without it the transformer stayed at 49.4% test in
    4,000 steps, with it 100.0%); weight decay 0.1, no warm-up, 4,000
    steps evaluated every 250. Kept from
    small: width 64, vocabulary 256, 20,000 training sequences, batch 64,
    2 layers, lr 3e-3 (Zoology: vocabulary 8,192, 100,000 sequences,
    batch 512, up to 64 epochs, the best of 4 rates). Measured
    (experiments/mqar/README.md): small's short_conv 2 keeps mamba and hyena on
    the 1 / pairs plateau where this block lets them recall (h3 recalls
    here with head_dim 2, Zoology's).
Only `small` and `smoke` use short_conv; the reference does not.

dtype: on a GPU or TPU, add --config.dtype=bfloat16 as the default there
(activations and matmuls in bfloat16; parameters, softmax, normalisers and
the loss stay float32, models/). CPU runs keep the config's float32.
"""

from configs import base, models

# The `small` preset's length is 64: the cores whose defaults are sized for
# LRA's 1K-4K (a 64-wide stride, 512-wide windows, 64-long blocks, chunks,
# segments and projections) would see every key there and equal softmax
# attention. Sized for 64 instead, each keeps what makes it efficient: a
# query sees a few blocks or a window of 16, a stride of 8 (sqrt(64), the
# Sparse Transformer's rule), a projection to 16, segments of 16.
SMALL_MODEL_OVERRIDES = {
  'local': {'model.attention.block_size': 16},
  'sparse_transformer': {'model.attention.stride': 8},
  'longformer': {'model.attention.window': 16},
  # 16 blocks of 4: 3 window + 2 global + 3 random = half of them.
  'bigbird': {'model.attention.block_size': 4},
  'reformer': {'model.attention.chunk_size': 16},
  'linformer': {'model.attention.proj_length': 16},
  'sinkhorn': {'model.attention.block_size': 16},
  'transformer_xl': {'model.segment_length': 16},
  'compressive_transformer': {'model.segment_length': 16},
}


def get_config(arg=None):
  model_name, presets = base.parse_arg(arg)
  c = base.get_base_config()
  c.task = 'mqar'
  c.objective = 'per_position'  # the data's labels at the query positions
  d = c.data
  d.vocab_size = 8192  # ids: 0 padding, keys [1, V/2), values [V/2, V)
  d.seq_len = 256
  d.num_kv_pairs = 16
  d.power_a = 0.01  # query gap g drawn with P(g) ~ (g + 1)^(power_a - 1)
  d.form = 'causal'  # or 'bidirectional' (a mask id in each answer slot)
  d.num_train = 100_000
  d.num_val = 1_000
  d.num_test = 3_000
  # Extra test splits, 'seq_len:num_kv_pairs,...' ('' = none).
  d.test_splits = ''
  d.seed = 0  # the data's seed (config.seed seeds the model and order)
  c.max_length = d.get_ref('seq_len')
  c.batch_size = 256
  c.num_train_steps = 25_000
  c.eval_every_steps = 1_000
  c.checkpoint_every_steps = 1_000
  c.learning_rate = 1e-3
  c.schedule = 'cosine'
  c.warmup_steps = 0
  c.weight_decay = 0.1
  c.adam_b1, c.adam_b2, c.adam_eps = 0.9, 0.999, 1e-8
  m = c.model
  m.num_layers = 2
  m.emb_dim = 128
  m.qkv_dim = 128
  m.num_heads = 1
  m.mlp_dim = 256
  m.dropout_rate = 0.0
  m.attention_dropout_rate = 0.1
  m.pooling = 'mean'  # no CLS token (the per-position model pools nothing)
  m.positions = 'learned'
  models.apply_model(c, model_name)

  if 'zoology' in presets and 'small' not in presets:
    presets = ['small', *presets]  # zoology is small's sizes, Zoology's block
  if 'small' in presets:
    d.update(
      dict(
        vocab_size=256,
        seq_len=64,
        num_kv_pairs=8,
        num_train=20_000,
        num_val=500,
        num_test=1_000,
        test_splits='64:4,64:12,64:16,128:16',
      )
    )
    base.apply_small(
      c,
      num_train_steps=500,
      warmup_steps=30,
      num_layers=2,
      emb_dim=64,
      num_heads=2,
      mlp_dim=128,
      dropout_rate=0.0,
      eval_every_steps=100,
    )
    c.batch_size = 64
    c.learning_rate = 3e-3
    # Widths follow model.emb_dim (the width sweep's one flag, Zoology's
    # Figure 2 x axis): qkv as wide, the feed-forward twice as wide.
    m.qkv_dim = m.get_ref('emb_dim')
    m.mlp_dim = m.get_ref('emb_dim') * 2
    for key, value in SMALL_MODEL_OVERRIDES.get(model_name, {}).items():
      c.update_from_flattened_dict({key: value})
    # The causal mask and the convolution order the tokens (Zoology's
    # original MQAR attention models: no position embeddings either).
    m.positions = 'none'
    m.short_conv = 2
  if 'zoology' in presets:
    # Zoology's figure-2 block and recipe at `small`'s sizes (the preset
    # docstring above): a mixer alone, no positions and no short_conv (it
    # has its own convolutions); an attention core with learned positions
    # (Zoology's max_position_embeddings = seq_len) and short_conv 2 (its
    # original MQAR configs' convolution before attention; without it the
    # transformer stayed at 49% here in 4,000 steps, with it 100%).
    d.num_kv_pairs = 4
    d.test_splits = '64:8,64:16'
    m.block = 'ssm'
    mixer = models.is_mixer_model(c)
    m.short_conv = 0 if mixer else 2
    m.positions = 'none' if mixer else 'learned'
    c.weight_decay = 0.1
    c.warmup_steps = 0
    c.num_train_steps = 4000
    c.eval_every_steps = 250
    c.checkpoint_every_steps = 250
  if 'smoke' in presets:
    d.update(
      dict(
        vocab_size=64,
        seq_len=32,
        num_kv_pairs=4,
        num_train=256,
        num_val=64,
        num_test=64,
        test_splits='16:2,64:8',
      )
    )
    base.apply_smoke(c, max_length=32)
    m.short_conv = 2
  return base.finalize(c, presets, base.TASK_PRESETS['mqar'])
