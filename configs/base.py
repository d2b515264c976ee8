"""Defaults shared by every task. Task files override; the result is locked.

Values are the reference harness's (google-research/long-range-arena) where it
had one; lra/reference/lra_configs.md lists them per task, with the
reference's known defects.

train.py checks every field before it creates anything (lra/train/validate.py):
counts and intervals >= 1, rates in range, model.num_heads dividing
model.qkv_dim, max_length >= 1 (at most the pixels of an image for the
pixel tasks); a bad value stops with one sentence naming the flag and a
valid value.
Resuming a workdir keeps its config, except the run-length and bookkeeping
fields (lra.train.rundir.RESUMABLE_CHANGES) and the optimiser settings
(learning_rate, schedule, warmup_steps, weight_decay, adam_*,
grad_clip_norm; lra.train.rundir.OPTIMISER_CHANGES), which may change from the
resumed step on: the change is recorded in config.json ('resume_changes')
and metrics.jsonl (a row of split 'config'). This is how the advice after a
non-finite loss is followed: the same command with a lower learning rate or
with clipping resumes from the last good checkpoint.
"""

import ml_collections


def get_base_config():
  c = ml_collections.ConfigDict()
  # Task registry key (lra/data/__init__.py); set by the task file.
  c.task = ''
  # Presets applied, e.g. 'small' or 'small,spt' (the alias small_spt; ''
  # = the LRA reference configuration).
  c.preset = ''
  # Model name (lra/train/options.py); set from the `:<model>` argument.
  c.model_name = ''
  # Seeds parameters, data order and dropout; same seed, same run.
  c.seed = 0
  # Data root; '' means $LRA_DATA_DIR or ~/lra_data.
  c.data_dir = ''
  # Task-specific data options (variant, resolution, ...); see the task file.
  c.data = ml_collections.ConfigDict()
  # Sequence length the model sees (inputs cut or padded to it).
  c.max_length = 0

  # Global batch size, split over all devices (must divide evenly).
  c.batch_size = 32
  # Eval batch size; 0 means batch_size.
  c.eval_batch_size = 0
  # Optimizer steps to train.
  c.num_train_steps = 5000
  # Evaluate on validation every N steps (and at the end).
  c.eval_every_steps = 500
  # Save a checkpoint every N steps (and at the end).
  c.checkpoint_every_steps = 500
  # Also save when this many minutes of wall time have passed since the last
  # save (checked at log steps; 0: by steps only). A SIGTERM (preemption)
  # saves at the end of the current step whatever this says.
  c.checkpoint_every_minutes = 0.0
  # Training batches prepared and transferred this many steps ahead, on a
  # worker thread (lra/train/prefetch.py; the same numbers whatever the depth);
  # 0: in the loop's thread; -1: 0 on a CPU (faster there: the worker
  # contends with the step's dispatch for Python's lock), 2 on a GPU/TPU.
  c.prefetch = -1
  # Log training metrics every N steps.
  c.log_every_steps = 50
  # Checkpoints of the latest steps to keep (the best one is kept apart).
  c.keep_checkpoints = 2
  # Model selection: which test accuracy eval.py --table reports (both are
  # in results.json): 'best_val' (the best-validation checkpoint's, `test`),
  # 'last' (the final step's, `test_last`, as the LRA reference) or '' =
  # 'last' when the validation split is the test set (Text with
  # data.val='test'), else 'best_val' (lra/train/metrics.py).
  c.select = ''
  # Fine-tune from another run (lra/train/pretrained.py): the --workdir of a
  # (pre)training run whose encoder (embeddings, CLS, blocks, final
  # LayerNorm) this run starts from, heads and optimizer fresh; '' = none.
  # A learned position table is extended to a longer max_length by copying
  # its rows (Longformer). Read only by a fresh run, never on resuming.
  c.init_from = ''
  # Which of its checkpoints: 'best' (on validation) or 'latest'.
  c.init_from_checkpoint = 'best'
  # Length curriculum (lra/train/curriculum.py, Shortformer): comma-separated
  # steps:max_length stages run in order, e.g. '1000:256,2000:1024', then
  # config.max_length to the end; shorter stages train on crops of the same
  # examples (classification: the prefix; LM objectives: random windows).
  # '' = every step at max_length.
  c.length_schedule = ''
  # Weights & Biases (lra/train/wandb_log.py; needs `pip install wandb`): the
  # project the run logs to, the same scalars as TensorBoard at the same
  # steps, plus this config; files in <workdir>/wandb/. '' = off.
  c.wandb_project = ''
  # wandb's mode: 'online', 'offline' (no network; `wandb sync` later) or
  # 'disabled'; '' = wandb's own default (WANDB_MODE, else online).
  c.wandb_mode = ''

  # Peak learning rate.
  c.learning_rate = 0.05
  # 'rsqrt' (linear warmup, then 1/sqrt(step)), 'cosine' or 'constant'.
  c.schedule = 'rsqrt'
  # Linear warmup steps.
  c.warmup_steps = 1000
  # Decoupled weight decay, multiplied by the learning rate (optax.adamw).
  c.weight_decay = 0.1
  # State-space mixers' own parameter group (their authors' recipe): > 0
  # trains the parameters each mixer lists in `ssm_params` (S4D, H3: A, B,
  # dt; S5: Lambda, B, steps; Mamba, Mamba-2: A_log, D (and dt_bias))
  # at this peak rate on the same schedule, with ssm_weight_decay; 0: one
  # group, every parameter at learning_rate with weight_decay.
  c.ssm_learning_rate = 0.0
  c.ssm_weight_decay = 0.0
  # Adam moments and epsilon.
  c.adam_b1 = 0.9
  c.adam_b2 = 0.98
  c.adam_eps = 1e-9
  # Clip gradients to this global norm; 0 disables clipping.
  c.grad_clip_norm = 0.0
  # Accumulate gradients over N micro-batches (optax.MultiSteps).
  c.grad_accum_steps = 1
  # Compute dtype of activations: 'float32' or 'bfloat16'. Params stay f32.
  c.dtype = 'float32'
  # Training objective (lra/train/objectives.py): 'classify' (the task's
  # labels), or self-pretraining on the task's own inputs, labels unused:
  # 'causal_lm' (next-token prediction under a causal mask) or 'masked_lm'
  # (BERT's denoising: mask_rate of the real tokens chosen, 80% replaced by
  # a mask id, 10% by a random token, 10% kept; loss on them only).
  c.objective = 'classify'
  # Fraction of real tokens chosen per example by masked_lm.
  c.mask_rate = 0.15

  m = c.model = ml_collections.ConfigDict()
  # Transformer blocks.
  m.num_layers = 4
  # Width of the residual stream (token embedding size).
  m.emb_dim = 512
  # Total width of queries/keys/values over all heads.
  m.qkv_dim = 512
  # Attention heads.
  m.num_heads = 8
  # Hidden width of the feed-forward block and of the classifier head.
  m.mlp_dim = 1024
  # Dropout on embeddings, residual branches and the feed-forward block.
  m.dropout_rate = 0.1
  # Dropout on attention weights (cores that have explicit weights).
  m.attention_dropout_rate = 0.1
  # Standard deviation of the token embedding's normal initialisation: 1.0
  # (the LRA reference's) or 0.02 (GPT-2's, and the Mamba authors' and
  # Zoology's _init_weights).
  m.embed_std = 1.0
  # Pooling for classification: 'cls' (a prepended CLS token), 'mean', 'max'
  # or 'first' (the first input token, no CLS: the reference's Retrieval
  # dual encoder).
  m.pooling = 'cls'
  # Absolute: 'sinusoidal', 'learned', 'sinusoidal2d' / 'learned2d' (images:
  # row + column parts) or 'none'; in attention: 'relative', 'pia',
  # 'rotary' (models/embeddings.py).
  m.positions = 'sinusoidal'
  # Attention core or sequence mixer: its registry name and every option of
  # its constructor (models/attention/registry.py options_of), defaults
  # filled by the task file (lra/train/options.py apply_model); set any with
  # --config.model.attention.<option>=<value>.
  m.attention = ml_collections.ConfigDict({'name': 'softmax'})
  # The block (models/layers.py): 'transformer' (pre-LN: sequence mixing,
  # then a feed-forward of width mlp_dim) or 'ssm' (the S4/S5 papers' LRA
  # block: norm, sequence mixing, dropout, residual; no feed-forward).
  m.block = 'transformer'
  # Depthwise causal conv of width K before each mixer (ShortConv); 0 = off.
  m.short_conv = 0
  # model.block=ssm only: 'layer' or 'batch' norm, before (prenorm) or after
  # the residual sum.
  m.norm = 'layer'
  m.prenorm = True
  # Reversible residual blocks (Reformer; models/reversible.py): activations
  # rebuilt in the backward pass, so memory does not grow with the depth.
  m.reversible = False
  # Feed-forward applied to the sequence in this many chunks along the length
  # (less memory, same result).
  m.ffn_chunks = 1
  # Segment length s of the segment-recurrent encoder (models/recurrent.py),
  # used by the recurrent cores only (transformer_xl,
  # compressive_transformer): the input (with its CLS) is cut into segments
  # of s tokens, run in order, each layer keeping a memory of the previous
  # ones; an input shorter than s is one segment.
  m.segment_length = 512
  # Recompute each segment's activations in the backward pass (one
  # jax.checkpoint per segment; the memory is a stop-gradient, so nothing
  # else is lost): the recurrent models' training memory drops about 5x at
  # 4K for about 25% more time per step.
  m.segment_remat = False
  # Rematerialise each block (nnx.remat): the backward pass keeps only the
  # blocks' inputs and recomputes the rest; less memory, ~1/3 more compute.
  m.remat = False
  # Stack the blocks' parameters on a layer axis and run them with one
  # jax.lax.scan: compile time independent of the depth (checkpoints have
  # the stacked layout, so a run cannot switch it on resuming). Neither
  # applies to reversible blocks or to the recurrent encoder.
  m.scan_layers = False
  # LM objectives: the output layer is the token embedding (tied, the
  # default: the fine-tune inherits the embedding, which the output side
  # then trains too) or a Linear of its own (False).
  m.tie_lm_head = True
  return c


def apply_small(
  c,
  *,
  num_train_steps,
  warmup_steps,
  num_layers,
  emb_dim,
  num_heads,
  mlp_dim,
  dropout_rate,
  eval_every_steps=500,
  weight_decay=0.01,
):
  """The `small` presets' CPU recipe: AdamW 1e-3 with warmup and cosine
  decay, no attention dropout, evaluation and checkpoints every 500 steps;
  the task picks the model size, the steps and the data."""
  c.update(
    dict(
      num_train_steps=num_train_steps,
      warmup_steps=warmup_steps,
      eval_every_steps=eval_every_steps,
      checkpoint_every_steps=500,
      log_every_steps=50,
      learning_rate=1e-3,
      schedule='cosine',
      weight_decay=weight_decay,
    )
  )
  c.model.update(
    dict(
      num_layers=num_layers,
      emb_dim=emb_dim,
      qkv_dim=emb_dim,
      num_heads=num_heads,
      mlp_dim=mlp_dim,
      dropout_rate=dropout_rate,
      attention_dropout_rate=0.0,
    )
  )


def apply_smoke(c, max_length=64):
  """The `smoke` preset of every task: a 1-layer, 16-wide model for 6 steps
  (evaluated and checkpointed at 3 and 6); seconds on a CPU, for tests."""
  c.update(
    dict(
      max_length=max_length,
      batch_size=8,
      num_train_steps=6,
      eval_every_steps=3,
      checkpoint_every_steps=3,
      log_every_steps=2,
      warmup_steps=2,
    )
  )
  c.model.update(
    dict(num_layers=1, emb_dim=16, qkv_dim=16, num_heads=2, mlp_dim=32)
  )
  # Several segments (64 tokens + CLS: 4 of 16 and one of 1), so the
  # recurrent models' smoke runs exercise their memory.
  c.model.segment_length = 16


def apply_spt(c):
  """The `spt` preset (self-pretraining, Amos, Berant and Gupta, "Never
  Train from Scratch", arXiv 2310.02980): the same model and schedule
  trained with the masked_lm objective on the task's own training inputs,
  labels unused (lra/train/objectives.py). The fine-tune is the run without
  `spt`, started from its encoder with --config.init_from (lra.sweep.main does
  both with --preset small_spt). --config.objective=causal_lm pretrains
  left to right instead (not every core can be causal)."""
  c.objective = 'masked_lm'


def finalize(c, presets, task_presets=()):
  """Checks the preset names (the common ones and the task file's own
  `task_presets`), applies `spt` and locks the config (a misspelt key
  fails)."""
  valid = (*COMMON_PRESETS, *task_presets)
  unknown = [p for p in presets if p not in valid]
  if unknown:
    known = ', '.join((*valid, *ALIASES))
    raise ValueError(
      f'Unknown preset {unknown[0]!r} for the {c.task} task; its presets: '
      f'{known}.'
    )
  if 'spt' in presets:
    apply_spt(c)
  c.preset = ','.join(presets)
  c.lock()
  return c


# Preset names understood by every task file (each task defines what
# `small` and `smoke` do; `spt` is apply_spt on top of them).
COMMON_PRESETS = ('small', 'smoke', 'spt')
# A task file's own presets (passed to finalize; another task refuses them).
TASK_PRESETS = {'mqar': ('zoology',)}
# Every preset name a sweep may be given.
PRESETS = (*COMMON_PRESETS, *(p for ps in TASK_PRESETS.values() for p in ps))
# Shorthands: `small_spt` is `small,spt` (the config records 'small,spt').
ALIASES = {'small_spt': ('small', 'spt'), 'smoke_spt': ('smoke', 'spt')}
# Pretraining presets and the preset of their fine-tune (lra.sweep.main).
FINE_TUNE_PRESET = {'spt': '', 'small_spt': 'small', 'smoke_spt': 'smoke'}


def parse_arg(arg):
  """'performer,small' -> ('performer', ['small']); an alias is expanded
  ('transformer,small_spt' -> ('transformer', ['small', 'spt']))."""
  parts = [p.strip() for p in (arg or 'transformer').split(',') if p.strip()]
  presets = [q for p in parts[1:] for q in ALIASES.get(p, (p,))]
  return parts[0], list(dict.fromkeys(presets))
