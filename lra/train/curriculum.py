"""Length curriculum: train on short crops first, then on the full length.

Shortformer's staged training (Press, Smith and Lewis 2021, "Shortformer:
Better Language Modeling using Shorter Inputs", section 3): the first steps
see short inputs (cheap: attention is quadratic in the length), the later
ones the full length. Here the stages come from `config.length_schedule`,
a string of comma-separated `steps:max_length` stages run in order:

  --config.length_schedule=1000:256,2000:1024

trains steps 1..1000 on 256 tokens, 1001..3000 on 1024, and every step after
the last stage at config.max_length (the model's length: evaluation always
runs there). '' (the default) is no curriculum. A stage's length must be in
[1, config.max_length].

A shorter stage's batch is a crop of the very examples the full-length batch
at that step would hold (lra.train.batching: the batch is a function of (seed,
step)), so a resumed run sees exactly the batches of an uninterrupted one:
  classification: the prefix of the input (the encoder prepends its CLS as
    at full length: 'the prefix plus the CLS');
  language-model objectives: a random window of the real tokens among the
    max_length a full-length step would see (padding at the end is not
    counted as text), its start drawn from (seed, step)
    for each row of the global batch, so any number of processes crops
    alike.
The shapes change once per stage, so the jit-compiled step compiles once per
stage, never per step.
"""

import numpy as np

from lra.errors import UserError

EXAMPLE = '1000:256,2000:1024'


def parse(text, max_length):
  """'1000:256,2000:1024' -> [(1000, 256), (3000, 1024)]: each stage's last
  step and its length; [] for ''. One sentence for a bad schedule."""
  text = (text or '').strip()
  if not text:
    return []
  flag = f'--config.length_schedule={text}'
  stages, end = [], 0
  for part in text.split(','):
    steps, sep, length = part.strip().partition(':')
    try:
      steps, length = int(steps), int(length)
    except ValueError:
      steps = length = None
    if not sep or steps is None or steps < 1 or length < 1:
      raise UserError(
        f'{flag} is not a list of steps:max_length stages with positive '
        f'integers; write e.g. --config.length_schedule={EXAMPLE}.'
      )
    if length > max_length:
      raise UserError(
        f'{flag} has a stage of {length} tokens, longer than '
        f'--config.max_length={max_length} (the model is built for it); '
        f'use stages of at most {max_length} tokens.'
      )
    end += steps
    stages.append((end, length))
  return stages


def length_at(stages, step, max_length):
  """The input length of training step `step` (counted from 1)."""
  for end, length in stages:
    if step <= end:
      return length
  return max_length


def real_lengths(inputs, pad_id):
  """Tokens before the trailing padding, per row (the width without a pad
  id): the last non-pad position + 1."""
  width = inputs.shape[-1]
  if pad_id is None:
    return np.full(inputs.shape[:-1], width, np.int64)
  real = inputs != pad_id
  last = width - np.argmax(real[..., ::-1], axis=-1)
  return np.where(real.any(-1), last, 0)


def crop(
  inputs,
  length,
  *,
  windows=False,
  seed=0,
  step=0,
  pad_id=None,
  rows=slice(None),
  global_rows=None,
):
  """Cuts the last axis of `inputs` ([b, (docs,) width]) to `length`.

  windows=False: the prefix. windows=True: for each row (each document of
  a retrieval pair alike) a window of `length` tokens starting at a random
  position in [0, max(0, real length - length)], drawn from (seed, step)
  for all `global_rows` rows of the global batch, of which `rows` (a slice)
  are these `inputs`.
  """
  width = inputs.shape[-1]
  if length >= width:
    return inputs
  if not windows:
    return np.ascontiguousarray(inputs[..., :length])
  n = inputs.shape[0] if global_rows is None else global_rows
  draw = np.random.default_rng([seed, step, 0xC209]).random(
    (n,) + inputs.shape[1:-1]
  )[rows]
  room = np.maximum(real_lengths(inputs, pad_id) - length, 0)
  start = np.floor(draw * (room + 1)).astype(np.int64)
  idx = start[..., None] + np.arange(length)
  return np.take_along_axis(inputs, idx, axis=-1)
