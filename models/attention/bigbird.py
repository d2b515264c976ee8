"""BigBird block-sparse attention, ITC (default) and ETC layouts.

Zaheer et al., "Big Bird: Transformers for Longer Sequences"
(arXiv 2007.14062).

Two ways to have global tokens (the paper, section 2): ITC (internal
transformer construction, `global_mode='itc'`, the default) makes existing
tokens global: the first and last block below; ETC (extended transformer
construction, `global_mode='etc'`) adds `num_global_tokens` extra learned
tokens (default 2, this harness's choice) in front of the sequence. ETC is
model-level: `extra_tokens(options)` tells models/encoder.py how many
learned embeddings to prepend (key padding True); the encoder removes them
again before it returns, so CLS pooling still pools the CLS and mean
pooling never averages them.

ETC, on a call whose first G positions are the global tokens and whose
remaining L positions are cut into N blocks of b (as below):
  - a global query attends to all G + L keys; every query attends to the G
    global keys;
  - real query block i also attends to real blocks i - 1, i, i + 1 (those
    that exist) and r random real blocks drawn without replacement from the
    blocks outside {i - 1, i, i + 1} (`etc_layout`, seeded as the ITC one);
    no real block is global.
One joint softmax per query. Cost: time O(L b (r + 3) D + 2 G L D) per head,
memory O(L (b (r + 3) + G)). Exact limit: every real block seen by every
real block, i.e. N <= 2 or r >= N - 2 (row 0 has N - 2 candidates). Causal
masks are refused in ETC (a global token sees every token).

ITC: the sequence is cut into blocks of b positions (block i holds positions
i*b .. i*b + b - 1; when b does not divide L the last block is the partial
one, padded inside the core and masked). With N blocks:
  - the first and the last block are global: their queries attend to every
    key, and every query attends to their keys;
  - every other query block i attends to blocks i - 1, i, i + 1 (window),
    the two global blocks, and r random key blocks drawn without replacement
    from the blocks outside {0, i - 1, i, i + 1, N - 1}; a row with fewer
    than r such blocks takes all of them.
Each query has one joint softmax over the union of its blocks (a block that
is both global and a neighbour counts once). Padding and `Mask.causal` are
applied on top of the pattern.

The random layout is a deterministic function of (seed, layer_index, head,
query block), drawn in numpy at trace time from static shapes with
`np.random.default_rng([seed, layer, head, block])` (`random_layout`): the
same in every process and on resume, different between heads and layers.

Cost: time O(L b (r + 5) D + 2 b L D) per head (the non-global query blocks
see (r + 5) b keys; the two global query blocks see all L keys); memory
O(L b (r + 5)) per head for the block logits. No L x L array is built.

Exact limit: equals softmax attention when every query block sees every key
block, i.e. N <= 3 (L <= 3 b), or r >= N - 4 (every row takes all remaining
blocks: rows 1 and N - 2 have N - 4 candidates, the others N - 5).

Causal: supported as the pattern intersected with j <= i (random or window
blocks after a query are simply masked, so they are wasted; the layout is
not redrawn from past blocks). With the last block global that block's
queries see all earlier keys, which is still causal.

Attention dropout (dropout_rate, when a key is given) on the softmax
weights, as in softmax attention.

Deliberate differences from the paper's block-sparse code and from the
reference harness (google-research/long-range-arena, bigbird_attention.py):
  - random blocks come from seeded numpy generators keyed by (seed, layer,
    head, query block), not from global numpy state seeded with Python's
    hash() of the module path, so the layout is reproducible across
    processes and resumes;
  - random blocks are drawn from every block outside the window and the
    global blocks; the reference only drew them from the first 1024
    positions (last_idx = min(L, 1024));
  - any length is accepted: the last block is the partial one, padded and
    masked inside the core, and any N >= 1 works (the reference always
    appended padding to the next multiple of b, a whole extra block when b
    divides L, and its block code assumes at least 5 blocks);
  - masks are exact (excluded keys get weight 0), not an additive -10000,
    so key padding is honoured everywhere, also in the global blocks;
  - duplicates (a neighbour block that is also global, for blocks 1 and
    N - 2) are masked so each key enters the softmax once;
  - rows with fewer than r candidate blocks take all of them, so short
    inputs become exact attention;
  - attention dropout is applied to the weights (the reference's sparse path
    had none);
  - causal masks keep the sparse pattern (pattern and j <= i); the reference
    fell back to full causal attention.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from models.attention.base import (
  AttentionCore,
  attend,
  int_option,
  key_valid_BxM,
  pad_to_multiple,
  recomputed,
  refuse_causal,
)
from models.attention.registry import register
from models.errors import UserError


@functools.lru_cache(maxsize=128)
def random_layout(seed, layer, num_heads, num_blocks, r):
  """The random key blocks of every (head, query block).

  Args:
    seed: the core's `seed` option (int >= 0).
    layer: the layer index (int >= 0).
    num_heads: H.
    num_blocks: N, the number of blocks after padding L to a multiple of b.
    r: random blocks per row.

  Returns:
    (blocks int32[H, N, r], valid bool[H, N, r]). Row i of head h lists the
    random key blocks of query block i; entries with valid False are unused
    (global rows 0 and N - 1 have none, rows with fewer than r candidates
    fill only the first ones). Read-only arrays (cached).
  """
  blocks = np.zeros((num_heads, num_blocks, r), np.int32)
  valid = np.zeros((num_heads, num_blocks, r), bool)
  if r > 0:
    for i in range(1, num_blocks - 1):
      window = (0, i - 1, i, i + 1, num_blocks - 1)
      candidates = np.setdiff1d(np.arange(num_blocks), window)
      take = min(r, candidates.size)
      if not take:
        continue
      for h in range(num_heads):
        rng = np.random.default_rng([seed, layer, h, i])
        blocks[h, i, :take] = rng.choice(candidates, take, replace=False)
        valid[h, i, :take] = True
  blocks.flags.writeable = False
  valid.flags.writeable = False
  return blocks, valid


@functools.lru_cache(maxsize=128)
def middle_layout(seed, layer, num_heads, num_blocks, r):
  """Key blocks of the non-global query blocks 1 .. N - 2.

  Returns:
    (blocks int32[H, N - 2, 5 + r], valid bool[H, N - 2, 5 + r]): per row the
    slots [first, i - 1, i, i + 1, last, random...]; valid is False for
    unused random slots and for a block already listed in an earlier slot.
  """
  rand_blocks, rand_valid = random_layout(seed, layer, num_heads, num_blocks, r)
  rows = np.arange(1, num_blocks - 1)
  fixed = np.stack(
    [np.zeros_like(rows), rows - 1, rows, rows + 1, 0 * rows + num_blocks - 1],
    axis=-1,
  )
  fixed = np.broadcast_to(fixed, (num_heads,) + fixed.shape)
  blocks = np.concatenate([fixed, rand_blocks[:, 1:-1]], axis=-1)
  valid = np.concatenate(
    [np.ones(fixed.shape, bool), rand_valid[:, 1:-1]], axis=-1
  )
  # A slot repeating a block listed in an earlier slot is masked.
  same = blocks[..., :, None] == blocks[..., None, :]
  earlier = np.tril(np.ones((blocks.shape[-1],) * 2, bool), -1)
  valid &= ~np.any(same & earlier & valid[..., None, :], axis=-1)
  blocks = blocks.astype(np.int32)
  blocks.flags.writeable = False
  valid.flags.writeable = False
  return blocks, valid


@functools.lru_cache(maxsize=128)
def etc_layout(seed, layer, num_heads, num_blocks, r):
  """Key blocks of every real query block in ETC mode.

  Returns:
    (blocks int32[H, N, 3 + r], valid bool[H, N, 3 + r]): per row the slots
    [i - 1, i, i + 1, random...] over the real blocks (the global tokens are
    added by the core); valid is False for a window slot outside 0 .. N - 1
    (its block index is clipped), for unused random slots and for a block
    already listed in an earlier slot. Random blocks are drawn without
    replacement from the blocks outside {i - 1, i, i + 1} with
    `np.random.default_rng([seed, layer, head, block])`; a row with fewer
    than r candidates takes all of them. Read-only arrays (cached).
  """
  n = num_blocks
  rows = np.arange(n)
  window = np.stack([rows - 1, rows, rows + 1], axis=-1)
  blocks = np.zeros((num_heads, n, 3 + r), np.int32)
  valid = np.zeros((num_heads, n, 3 + r), bool)
  blocks[:, :, :3] = np.clip(window, 0, n - 1)
  valid[:, :, :3] = (window >= 0) & (window < n)
  for i in range(n):
    candidates = np.setdiff1d(rows, window[i])
    take = min(r, candidates.size)
    if not take:
      continue
    for h in range(num_heads):
      rng = np.random.default_rng([seed, layer, h, i])
      blocks[h, i, 3 : 3 + take] = rng.choice(candidates, take, replace=False)
      valid[h, i, 3 : 3 + take] = True
  # A slot repeating a block listed in an earlier valid slot is masked.
  same = blocks[..., :, None] == blocks[..., None, :]
  earlier = np.tril(np.ones((3 + r, 3 + r), bool), -1)
  valid &= ~np.any(same & earlier & valid[..., None, :], axis=-1)
  blocks.flags.writeable = False
  valid.flags.writeable = False
  return blocks, valid


GLOBAL_MODES = ('itc', 'etc')


def etc_tokens(global_mode, num_global_tokens):
  """How many global tokens ETC prepends (0 in ITC), or one sentence."""
  if global_mode not in GLOBAL_MODES:
    raise UserError(
      f'bigbird global_mode must be one of {", ".join(GLOBAL_MODES)}, got '
      f'{global_mode!r}; set e.g. --config.model.attention.global_mode=etc.'
    )
  if isinstance(num_global_tokens, str) and num_global_tokens.isdigit():
    num_global_tokens = int(num_global_tokens)  # from the command line
  g = int_option('bigbird', 'num_global_tokens', num_global_tokens, 1, 2)
  return g if global_mode == 'etc' else 0


@register('bigbird')
class BigBirdAttention(AttentionCore):
  supports_causal = True
  rotary = 'scores'

  def __init__(
    self,
    *,
    num_heads,
    head_dim,
    max_length,
    dropout_rate,
    dtype,
    rngs,
    layer_index=0,
    block_size=64,
    num_random_blocks=3,
    seed=0,
    global_mode: str = 'itc',
    num_global_tokens: int = 2,
  ):
    del max_length, rngs
    # ETC: the first num_global_tokens positions of every call are the
    # prepended global tokens (models/encoder.py); 0 in ITC.
    self.etc_tokens = etc_tokens(global_mode, num_global_tokens)
    self.global_mode = global_mode
    self.block_size = int_option('bigbird', 'block_size', block_size, 1, 64)
    self.num_random_blocks = int_option(
      'bigbird', 'num_random_blocks', num_random_blocks, 0, 3
    )
    self.seed = int_option('bigbird', 'seed', seed, 0, 0)
    self.layer_index = int_option('bigbird', 'layer_index', layer_index, 0, 0)
    self.num_heads = num_heads
    self.dropout_rate = dropout_rate
    self.scale = head_dim**-0.5
    self.dtype = dtype

  @classmethod
  def extra_tokens(cls, options):
    """How many learned tokens the encoder prepends for this core's
    options (a model.attention dict): num_global_tokens in ETC, else 0."""
    return etc_tokens(
      options.get('global_mode', 'itc'), options.get('num_global_tokens', 2)
    )

  def layout(self, length):
    """The random layout used at query length L: ITC (random blocks
    [H, N, r], valid [H, N, r]); ETC (etc_layout of the L - G real
    positions: blocks [H, N, 3 + r], valid [H, N, 3 + r])."""
    if self.etc_tokens:
      n = -(-max(length - self.etc_tokens, 0) // self.block_size)
      return etc_layout(
        self.seed, self.layer_index, self.num_heads, n, self.num_random_blocks
      )
    n = -(-length // self.block_size)
    return random_layout(
      self.seed, self.layer_index, self.num_heads, n, self.num_random_blocks
    )

  def __call__(
    self, q_BxLxHxD, k_BxMxHxD, v_BxMxHxD, mask, *, rngs=None, memory=None
  ):
    del memory
    batch, length, heads, _ = q_BxLxHxD.shape
    if k_BxMxHxD.shape[1] != length:
      raise UserError(
        'bigbird needs as many keys as queries (self-attention), got '
        f'{length} queries and {k_BxMxHxD.shape[1]} keys.'
      )
    if self.etc_tokens:
      return self._etc(q_BxLxHxD, k_BxMxHxD, v_BxMxHxD, mask, rngs)
    valid_BxL = key_valid_BxM(mask, batch, length)
    if rngs is None or not self.dropout_rate > 0:
      rngs = None
    out_BxLxHxD = recomputed(
      lambda q, k, v, valid, key: self._itc(q, k, v, valid, mask.causal, key),
      q_BxLxHxD,
      k_BxMxHxD,
      v_BxMxHxD,
      valid_BxL,
      rngs,
    )
    return out_BxLxHxD.astype(self.dtype), {}

  def _itc(self, q_BxLxHxD, k_BxMxHxD, v_BxMxHxD, valid_BxL, causal, rngs):
    """ITC attention (module docstring); [B, L, H, D] in v's dtype."""
    batch, length, heads, _ = q_BxLxHxD.shape
    c = self.block_size
    n = -(-length // c)
    padded = n * c
    valid_BxM = pad_to_multiple(valid_BxL, c, 1, False)

    def blocked(x_BxLxHxD):
      x_BxLxHxD = pad_to_multiple(x_BxLxHxD, c, 1)
      x_BxHxLxD = jnp.transpose(x_BxLxHxD, (0, 2, 1, 3))
      return x_BxHxLxD.reshape(batch, heads, n, c, x_BxLxHxD.shape[-1])

    q_BxHxNxCxD = blocked(q_BxLxHxD)
    k_BxHxNxCxD = blocked(k_BxMxHxD)
    v_BxHxNxCxD = blocked(v_BxMxHxD)
    key_global = key_middle = None
    if rngs is not None:
      key_global, key_middle = jax.random.split(rngs)

    # Global query blocks (first, last) attend to every key.
    global_ids = [0] if n == 1 else [0, n - 1]
    q_BxHxGxCxD = q_BxHxNxCxD[:, :, np.array(global_ids)]
    k_BxHx1xMxD = k_BxHxNxCxD.reshape(batch, heads, 1, padded, -1)
    v_BxHx1xMxD = v_BxHxNxCxD.reshape(batch, heads, 1, padded, -1)
    allowed_global = valid_BxM[:, None, None, None, :]  # [B, 1, 1, 1, M]
    if causal:
      q_pos_GxC = np.array(global_ids)[:, None] * c + np.arange(c)
      causal_GxCxM = jnp.arange(padded) <= jnp.asarray(q_pos_GxC)[..., None]
      allowed_global = allowed_global & causal_GxCxM  # [B, 1, G, C, M]
    out_BxHxGxCxD = attend(
      q_BxHxGxCxD,
      k_BxHx1xMxD,
      v_BxHx1xMxD,
      allowed_global,
      scale=self.scale,
      rate=self.dropout_rate,
      key=key_global,
    )
    parts = [out_BxHxGxCxD[:, :, :1]]

    # Non-global query blocks attend to their gathered key blocks.
    if n > 2:
      blocks_HxNxS, slot_HxNxS = middle_layout(
        self.seed, self.layer_index, heads, n, self.num_random_blocks
      )
      s = blocks_HxNxS.shape[-1]
      h_idx = np.arange(heads)[:, None, None]
      k_BxHxNxSxCxD = k_BxHxNxCxD[:, h_idx, blocks_HxNxS]
      v_BxHxNxSxCxD = v_BxHxNxCxD[:, h_idx, blocks_HxNxS]
      k_BxHxNxKxD = k_BxHxNxSxCxD.reshape(batch, heads, n - 2, s * c, -1)
      v_BxHxNxKxD = v_BxHxNxSxCxD.reshape(batch, heads, n - 2, s * c, -1)
      valid_BxNxC = valid_BxM.reshape(batch, n, c)
      allowed_BxHxNxSxC = (
        valid_BxNxC[:, blocks_HxNxS] & slot_HxNxS[None, :, :, :, None]
      )
      # [B, H, N - 2, 1, K], with causal [B, H, N - 2, C, K].
      allowed_middle = allowed_BxHxNxSxC.reshape(batch, heads, n - 2, 1, s * c)
      if causal:
        k_pos_HxNx1xK = (blocks_HxNxS[..., None] * c + np.arange(c)).reshape(
          heads, n - 2, 1, s * c
        )
        q_pos_NxC = np.arange(1, n - 1)[:, None] * c + np.arange(c)
        causal_HxNxCxK = (
          jnp.asarray(k_pos_HxNx1xK) <= jnp.asarray(q_pos_NxC)[..., None]
        )
        allowed_middle = allowed_middle & causal_HxNxCxK
      parts.append(
        attend(
          q_BxHxNxCxD[:, :, 1:-1],
          k_BxHxNxKxD,
          v_BxHxNxKxD,
          allowed_middle,
          scale=self.scale,
          rate=self.dropout_rate,
          key=key_middle,
        )
      )
    if n > 1:
      parts.append(out_BxHxGxCxD[:, :, 1:])
    out_BxHxNxCxD = jnp.concatenate(parts, axis=2)
    out_BxHxLxD = out_BxHxNxCxD.reshape(batch, heads, padded, -1)[:, :, :length]
    return jnp.transpose(out_BxHxLxD, (0, 2, 1, 3))

  def _etc(self, q_BxTxHxD, k_BxTxHxD, v_BxTxHxD, mask, rngs):
    """ETC: the first G positions global, the rest block-sparse (window and
    random blocks) plus the G global keys; -> (out [B, T, H, D], {})."""
    refuse_causal(
      self,
      mask,
      " with global_mode='etc' (its global tokens see every token; "
      "global_mode='itc' can be causal)",
    )
    batch, total, heads, dim = q_BxTxHxD.shape
    g = min(self.etc_tokens, total)
    length = total - g  # the real positions
    valid_BxT = key_valid_BxM(mask, batch, total)
    key_global = key_real = None
    if rngs is not None and self.dropout_rate > 0:
      key_global, key_real = jax.random.split(rngs)
    heads_first = lambda x: jnp.transpose(x, (0, 2, 1, 3))  # noqa: E731

    # The global tokens attend to every key.
    out_BxHxGxD = attend(
      heads_first(q_BxTxHxD[:, :g]),
      heads_first(k_BxTxHxD),
      heads_first(v_BxTxHxD),
      valid_BxT[:, None, None, :],
      scale=self.scale,
      rate=self.dropout_rate,
      key=key_global,
    )
    if length == 0:
      return heads_first(out_BxHxGxD).astype(self.dtype), {}

    # Real query blocks: their window and random blocks, plus the G keys.
    c = self.block_size
    n = -(-length // c)
    valid_BxM = pad_to_multiple(valid_BxT[:, g:], c, 1, False)

    def blocked(x_BxLxHxD):
      x_BxHxLxD = heads_first(pad_to_multiple(x_BxLxHxD, c, 1))
      return x_BxHxLxD.reshape(batch, heads, n, c, dim)

    q_BxHxNxCxD = blocked(q_BxTxHxD[:, g:])
    k_BxHxNxCxD = blocked(k_BxTxHxD[:, g:])
    v_BxHxNxCxD = blocked(v_BxTxHxD[:, g:])
    blocks_HxNxS, slot_HxNxS = etc_layout(
      self.seed, self.layer_index, heads, n, self.num_random_blocks
    )
    s = blocks_HxNxS.shape[-1]
    h_idx = np.arange(heads)[:, None, None]

    def gathered(x_BxHxNxCxD, x_BxTxHxD):
      x_BxHxNxSxCxD = x_BxHxNxCxD[:, h_idx, blocks_HxNxS]
      x_BxHxNxKxD = x_BxHxNxSxCxD.reshape(batch, heads, n, s * c, dim)
      glob_BxHxNxGxD = jnp.broadcast_to(
        heads_first(x_BxTxHxD[:, :g])[:, :, None], (batch, heads, n, g, dim)
      )
      return jnp.concatenate([x_BxHxNxKxD, glob_BxHxNxGxD], axis=3)

    valid_BxNxC = valid_BxM.reshape(batch, n, c)
    allowed_BxHxNxSxC = (
      valid_BxNxC[:, blocks_HxNxS] & slot_HxNxS[None, :, :, :, None]
    )
    allowed_BxHxNx1xK = jnp.concatenate(
      [
        allowed_BxHxNxSxC.reshape(batch, heads, n, 1, s * c),
        jnp.broadcast_to(
          valid_BxT[:, None, None, None, :g], (batch, heads, n, 1, g)
        ),
      ],
      axis=-1,
    )
    out_BxHxNxCxD = attend(
      q_BxHxNxCxD,
      gathered(k_BxHxNxCxD, k_BxTxHxD),
      gathered(v_BxHxNxCxD, v_BxTxHxD),
      allowed_BxHxNx1xK,
      scale=self.scale,
      rate=self.dropout_rate,
      key=key_real,
    )
    out_BxHxLxD = out_BxHxNxCxD.reshape(batch, heads, n * c, dim)[:, :, :length]
    out_BxHxTxD = jnp.concatenate([out_BxHxGxD, out_BxHxLxD], axis=2)
    return heads_first(out_BxHxTxD).astype(self.dtype), {}
