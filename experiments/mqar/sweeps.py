"""The MQAR study's sweeps (experiments/mqar/README.md), as Python files for
`python -m lra.sweep --sweep experiments/mqar/sweeps.py:FN --out runs/mqar`.

Each function returns the parts lra/sweep/spec.py reads (tasks, models,
preset, grid, config, out); a list runs as that many sweeps, each into its
own folder below --out, which is the folder the README's report command
reads. Grid values are strings so that the run folders are named as the
README's tables' runs were (`learning_rate=3.2e-2`).
"""

# Zoology's Figure 2 models as the width grid runs them (the encoders that
# cannot be causal, linformer and sinkhorn, are in two_rates).
MODELS = (
  'transformer,based,gla,deltanet,linear_transformer,local,performer,'
  'reformer,bigbird,s4d,retnet,s5,h3,hyena,mamba2,mamba'
)
# Zoology's logspace(-4, -2) in half decades, and one step above it.
RATES = ['1e-4', '3.2e-4', '1e-3', '3.2e-3', '1e-2', '3.2e-2']
WIDTHS = ['128', '64', '32']
# The recurrent mixers given twelve times the grid's steps.
MIXERS = 'mamba,s4d,s5,retnet,mamba2,h3,hyena,gla,deltanet'
# Zoology's block: norm, mixer, residual; no feed-forward, no short_conv,
# weight decay 0.1, no warm-up (configs/mqar.py `block`).
ZOOLOGY_BLOCK = {
  'model.block': 'ssm',
  'model.short_conv': 0,
  'weight_decay': 0.1,
  'warmup_steps': 0,
}
# The block ablation's setting: Mamba at width 64, length 32, 4 pairs,
# lr 1e-3 on a 20,000-step cosine, evaluated every 250 steps.
SMALL_RECALL = {
  'learning_rate': '1e-3',
  'model.emb_dim': 64,
  'data.seq_len': 32,
  'data.num_kv_pairs': 4,
  'data.test_splits': '32:2',
  'num_train_steps': 20000,
  'eval_every_steps': 250,
  'checkpoint_every_steps': 250,
}


def _grid_part(out, config, models=MODELS, widths=WIDTHS, rates=RATES):
  return {
    'tasks': 'mqar',
    'models': models,
    'preset': 'small',
    'grid': {'model.emb_dim': widths, 'learning_rate': rates},
    'config': config,
    'out': out,
  }


def width_grid():
  """Zoology's Figure 2 at CPU scale: 16 models x widths 128, 64, 32 x six
  learning rates, 500 steps, at length 64 with 8 pairs (64x8) and at
  length 128 with 16 pairs (128x16): 2 x 288 runs."""
  return [
    _grid_part('64x8', {'data.test_splits': '64:4,64:16'}),
    _grid_part(
      '128x16',
      {
        'data.seq_len': 128,
        'data.num_kv_pairs': 16,
        'data.test_splits': '128:8',
      },
    ),
  ]


def rate_above():
  """One rate above the grid (1e-1) at the 64:8 points where 3.2e-2 won
  and validation was still rising at step 500."""
  return _grid_part(
    '64x8_up',
    {'data.test_splits': '64:4,64:16'},
    models='retnet,reformer,mamba2',
    widths=['64', '32'],
    rates=['1e-1'],
  )


def long_schedule():
  """Twelve times the grid's steps for every recurrent mixer (width 128,
  lr 1e-3, 6,000 steps), and Mamba in Zoology's block on a 20,000-step
  schedule. Run on a GPU with --jobs 10 and
  JAX_DEFAULT_MATMUL_PRECISION=highest (float32 as on a CPU)."""
  common = {
    'model.emb_dim': 128,
    'eval_every_steps': 500,
    'checkpoint_every_steps': 500,
    'data.test_splits': '64:4,64:16',
  }
  return [
    {
      'tasks': 'mqar',
      'models': MIXERS,
      'preset': 'small',
      'grid': {'learning_rate': ['1e-3']},
      'config': {**common, 'num_train_steps': 6000},
      'out': 'long',
    },
    {
      'tasks': 'mqar',
      'models': 'mamba',
      'preset': 'small',
      'grid': {'learning_rate': ['1e-3']},
      'config': {**ZOOLOGY_BLOCK, **common, 'num_train_steps': 20000},
      'out': 'long_zoo',
    },
  ]


def block():
  """Mamba in the `small` preset's block and with each of its four
  differences from Zoology's block undone (feed-forward, short_conv,
  weight decay, warm-up): which of them keeps it on the plateau."""
  arms = {
    'block_cpu': {},
    'block_ffn': {
      'model.short_conv': 0,
      'weight_decay': 0.1,
      'warmup_steps': 0,
    },
    'block_sc': {'model.short_conv': 0},
    'block_wd': {'weight_decay': 0.1},
    'block_zsc': {**ZOOLOGY_BLOCK, 'model.short_conv': 2},
  }
  return [
    {
      'tasks': 'mqar',
      'models': 'mamba',
      'preset': 'small',
      'config': {**SMALL_RECALL, **arm},
      'out': out,
    }
    for out, arm in arms.items()
  ]


def short_conv_off():
  """hyena and h3 (head_dim 1) in the `small` preset's block without its
  short_conv, at width 128, 8 pairs, lr 3.2e-3, a 4,000-step cosine."""
  return {
    'tasks': 'mqar',
    'models': 'hyena,h3',
    'preset': 'small',
    'config': {
      'model.emb_dim': 128,
      'model.short_conv': 0,
      'learning_rate': '3.2e-3',
      'num_train_steps': 4000,
      'eval_every_steps': 250,
      'checkpoint_every_steps': 250,
      'data.test_splits': '64:4,64:16',
    },
    'out': 'short_conv_off',
  }


def selection():
  """Mamba's selection switched off (dt, B, C constants: the Mamba paper's
  ablation) beside the selective Mamba, in Zoology's block."""
  return {
    'tasks': 'mqar',
    'models': 'mamba',
    'preset': 'small',
    'grid': {'model.attention.selective': ['true', 'false']},
    'config': {**SMALL_RECALL, **ZOOLOGY_BLOCK},
    'out': 'lti_cpu',
  }


def h3_head_dim():
  """H3 at head_dim 8, 1 (its default) and 2 (Zoology's) in the `small`
  preset at width 128, 8 pairs, lr 3.2e-3, 4,000 steps."""
  config = {
    'model.emb_dim': 128,
    'learning_rate': '3.2e-3',
    'num_train_steps': 4000,
    'eval_every_steps': 500,
    'checkpoint_every_steps': 500,
    'data.test_splits': '64:4,64:16',
  }
  return [
    {
      'tasks': 'mqar',
      'models': 'h3',
      'preset': 'small',
      'grid': {'model.attention.head_dim': head_dims},
      'config': config,
      'out': out,
    }
    for out, head_dims in (('h3_long', ['8', '1']), ('h3_hd2', ['2']))
  ]


def zoology_setting():
  """hyena and h3 in Zoology's figure-2 setting as far as a CPU allows:
  length 64, 4 pairs, the mixer alone in each block, lr 3.2e-3 on a
  20,000-step cosine (stopped by the session)."""
  common = {
    'learning_rate': '3.2e-3',
    'model.emb_dim': 128,
    'data.num_kv_pairs': 4,
    **ZOOLOGY_BLOCK,
    'num_train_steps': 20000,
    'eval_every_steps': 250,
    'checkpoint_every_steps': 250,
    'data.test_splits': '64:8,64:16',
  }
  hyena = {'model.attention.long_filters': 1}
  h3 = {'model.attention.head_dim': 2, 'model.attention.state_size': 64}
  ssm = {'ssm_learning_rate': '1e-3', 'ssm_weight_decay': 0}
  arms = (
    ('hyena_zoo', 'hyena', hyena),
    ('hyena_zoo64', 'hyena', {**hyena, 'model.emb_dim': 64}),
    ('h3_zoo', 'h3', h3),
    ('h3_zoo_ssm', 'h3', {**h3, **ssm}),
  )
  return [
    {
      'tasks': 'mqar',
      'models': model,
      'preset': 'small',
      'config': {**common, **arm},
      'out': out,
    }
    for out, model, arm in arms
  ]


def zoology_preset():
  """The transformer in the `zoology` preset with and without its
  short_conv 2."""
  return [
    {
      'tasks': 'mqar',
      'models': 'transformer',
      'preset': 'zoology',
      'config': config,
      'out': out,
    }
    for out, config in (
      ('zoo_preset', {'model.short_conv': 0}),
      ('zoo_preset_sc', {}),
    )
  ]


def seeds():
  """Two seeds at the 64:8 grid's best points of four recallers."""
  points = (
    ('transformer', '64', '3.2e-3'),
    ('based,linear_transformer,deltanet', '128', '1e-2'),
  )
  return [
    {
      'tasks': 'mqar',
      'models': models,
      'preset': 'small',
      'grid': {
        'model.emb_dim': [width],
        'learning_rate': [rate],
        'seed': ['0', '1'],
      },
      'config': {'data.test_splits': '64:4,64:16'},
      'out': 'seeds',
    }
    for models, width, rate in points
  ]


def two_rates():
  """The first comparison of every model (two rates, widths 64 and 32),
  for the models the width grid leaves out: the bidirectional encoders
  (linformer, sinkhorn) beside a bidirectional transformer, and the
  others at width 64 (mqar64) and 32 (mqar32)."""
  rates = {'learning_rate': ['3e-3', '1e-2']}
  return [
    {
      'tasks': 'mqar',
      'models': 'all,-linformer,-sinkhorn',
      'preset': 'small',
      'grid': rates,
      'out': 'mqar64',
    },
    {
      'tasks': 'mqar',
      'models': 'linformer,sinkhorn,transformer',
      'preset': 'small',
      'grid': rates,
      'config': {'data.form': 'bidirectional'},
      'out': 'mqar64_bi',
    },
    {
      'tasks': 'mqar',
      'models': 'transformer,linear_transformer,mamba',
      'preset': 'small',
      'grid': rates,
      'config': {
        'model.emb_dim': 32,
        'model.qkv_dim': 32,
        'model.mlp_dim': 64,
      },
      'out': 'mqar32',
    },
  ]
