"""Reformer LSH attention (shared query/key, angular hashing, chunked).

Kitaev, Kaiser and Levskaya, "Reformer: The Efficient Transformer"
(arXiv 2001.04451).

Equation in words: keys are the queries normalised to unit length,
k_j = q_j / |q_j|, and score(i, j) = q_i . k_j / sqrt(D). Each hash round r
draws a random rotation R_r [D, N/2] and puts token i in bucket
argmax([q_i R_r; -q_i R_r]) (angular LSH; N = 1: one bucket). Tokens are
sorted by (bucket, position), the sorted sequence is cut into chunks of C,
and each query attends, with softmax over its visible keys, to the keys of
its own chunk and of the previous one that are in its bucket, not padded,
and (with a causal mask) not later than itself. A token attends to itself
only when it has no other visible key: its own score gets -1e5, as in the
paper. With R > 1 rounds a query attends to the union of its rounds' key
sets, each key once (the paper's eq. 12-16, appendix A): in round r the
score of a pair seen in N_ij of the R rounds gets - log N_ij, and the
rounds' outputs o_r and log-sum-exps z_r are combined as
sum_r softmax_r(z_r) o_r, which is then exactly softmax over the union.
N_ij counts the rounds r' in which j has i's bucket and lies in i's chunk
or the previous one in r' (the pair is attended in r'; padding and causal
masks do not depend on the round): each token's (bucket, chunk) per round
is an [R] vector, compared for every gathered pair, as the dedup of the
Reformer authors' trax code did. The self pair counts too (- log R on top
of -1e5). dedup=False keeps the plain combination, where a key seen in k
rounds gets k times its weight. Outputs are un-sorted by a gather with the
inverse permutation.

Number of buckets: num_buckets=0 (the default) sizes it from the sequence
length of the call, as the paper does (section 2: chunks of
C = 2 L / n_buckets, a bucket averaging half a chunk): 2 ceil(L / C), with
C = min(chunk_size, L), so a same-bucket key of a query is almost always in
its chunk or the previous one. A fixed number of buckets at growing L makes
buckets longer than the two chunks a query sees: at L = 4K and C = 64, ten
buckets hold about 410 tokens each and a query could see at most 128 of
them. With the default chunk 64 the LRA reference configs (lengths with
the CLS token) get: ListOps (2001) 64 buckets, Text (1001) 32, Retrieval
(4001) 126, Image (1025) 34, Pathfinder (1024) 32, Path-X (16384) 512, and
benchmark.py's 4K Text (4097) 130; the reference harness's 10 are
`--config.model.attention.num_buckets=10`. The number follows the call's
length, not max_length (the same in LRA, which pads every input to
max_length; shorter under a length curriculum), as the rotations are drawn
at call time.

Cost, per head and round: time O(L log L) for the sort, O(L D N) for the
hash (N/2 rotations) and O(L C D) for the chunked attention; memory O(L C)
for the attention and O(L N) for the hash's products (transient: argmax has
no gradient). Never an L x L array, but the automatic N ~ 2 L / C makes the
hash O(L^2 D / C): at C = 64 its multiply-adds are a quarter of the
attention's at 4K and as many at 16K, where its [L, N] products are 4x the
chunk logits (trax factorises N > 128 into two hashes; not done here).
In total O(B H R L (C + D + N)) memory for R = num_hashes rounds; the
de-duplication adds a comparison of R-vectors per gathered pair,
O(B H R^2 L C) time for [B, H, R, L, 2C] integer counts (nothing at R = 1).

Exact limit: with num_buckets=1 and chunk_size >= L (one chunk) every query
sees every visible key once, and the core equals softmax over the visible
j != i of score(i, j); a query with no other visible key returns its own
value (and a query with no visible key at all, zeros).

Choices and differences (the reference harness is
google-research/long-range-arena, lra_benchmarks/models/reformer):
- Rotations are independent per head and per round: [H, D, R, N/2] normals.
  In training they are drawn from the call-time key folded with the layer
  index (a fresh hash every step, as in the paper); at evaluation (no key)
  from fold_in(key(seed), layer_index): deterministic, different per layer.
  The reference used one fixed key (PRNGKey(0)) for every head, layer and
  step.
- Pairs in different buckets that share a chunk window are masked (the set
  P_i of the paper); the reference let them attend.
- The self rule, key normalisation, padding and causal masks are the
  paper's; the reference had none of them (its keys were the raw queries,
  padded tokens were hashed and attended to, causal was a no-op).
- The first chunk looks back to the last chunk (wrap-around, as in the
  paper and the reference); with one chunk it is not looked at twice.
- chunk_size is the chunk length C; the reference cut the sequence into
  num_hashes * num_buckets chunks whatever L.
- De-duplication across rounds as in the paper (above); trax's counts used
  chunks of the rounds' concatenated sequence (a round's first chunk looked
  back to the previous round's last), here each round wraps round itself.
  The reference harness had none (dedup=False).
- num_buckets defaults to the paper's length-based choice; the reference
  harness used 10 at every length.
- Scores are divided by sqrt(D) (the reference multiplied by it).
- Padded positions (key padding, and the tail added to reach a multiple of
  C) sort after every real token, so they never move a real token's chunk
  (padding invariance), and are never visible as keys. A padded query
  keeps its hash bucket and attends to the real keys of its bucket in its
  window (in the exact limit: all of them, as softmax attention does);
  with none visible it outputs zeros.
- Attention dropout is applied to each round's weights.
"""

import jax
import jax.numpy as jnp

from models.attention.base import (
  AttentionCore,
  bool_option,
  dropout,
  key_valid_BxM,
)
from models.attention.registry import register
from models.errors import UserError

# Added to a token's score for itself: it keeps the weight only when no
# other key is visible (the paper's value).
SELF_PENALTY = 1e5
# log-sum-exp of a row with no visible key: its round gets no weight.
EMPTY_LSE = -1e9


@register('reformer')
class ReformerAttention(AttentionCore):
  supports_causal = True
  shared_qk = True
  # Rotated once (shared q/k): hashing and the normalised keys see the
  # rotated vectors, whose dot products are the rotary scores.
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
    num_hashes=1,
    num_buckets=0,
    chunk_size=64,
    dedup=True,
    seed=0,
  ):
    del max_length, rngs
    if int(num_hashes) < 1:
      raise UserError(
        f'Reformer num_hashes must be at least 1, got {num_hashes}; set '
        '--config.model.attention.num_hashes to 1 or more.'
      )
    if int(num_buckets) < 0 or (num_buckets > 1 and num_buckets % 2):
      raise UserError(
        f'Reformer num_buckets must be 0 (automatic: 2 per chunk), 1 or '
        f'even (angular LSH uses N/2 rotations), got {num_buckets}; set '
        '--config.model.attention.num_buckets accordingly.'
      )
    bool_option('Reformer', 'dedup', dedup)
    if int(chunk_size) < 1:
      raise UserError(
        f'Reformer chunk_size must be at least 1, got {chunk_size}; set '
        '--config.model.attention.chunk_size to a positive length.'
      )
    self.num_heads = num_heads
    self.head_dim = head_dim
    self.num_hashes = int(num_hashes)
    self.num_buckets = int(num_buckets)
    self.chunk_size = int(chunk_size)
    self.dedup = dedup
    self.seed = int(seed)
    self.layer_index = int(layer_index)
    self.dropout_rate = dropout_rate
    self.scale = head_dim**-0.5
    self.dtype = dtype

  def rotation_key(self, key):
    """The key of this call's rotations: call-time key or (seed, layer)."""
    if key is None:
      return jax.random.fold_in(jax.random.key(self.seed), self.layer_index)
    return jax.random.fold_in(key, self.layer_index)

  def buckets_for(self, length):
    """The number of buckets at sequence length L: num_buckets, or when it
    is 0 the paper's 2 per chunk, 2 ceil(L / C) with C = min(chunk_size, L)
    (C = 2 L / n_buckets, section 2: a bucket averages half a chunk)."""
    if self.num_buckets:
      return self.num_buckets
    c = min(self.chunk_size, length)
    return 2 * -(-length // c)

  def hash_buckets(self, q_BxLxHxD, key):
    """int32[B, H, R, L]: each token's bucket per head and round.

    key: the rotation key (see rotation_key).
    """
    b, length, h, d = q_BxLxHxD.shape
    num_buckets = self.buckets_for(length)
    if num_buckets == 1:
      return jnp.zeros((b, h, self.num_hashes, length), jnp.int32)
    rot_HxDxRxN = jax.random.normal(
      key, (h, d, self.num_hashes, num_buckets // 2), jnp.float32
    )
    x_BxLxHxRxN = jnp.einsum(
      'blhd,hdrn->blhrn',
      q_BxLxHxD.astype(jnp.float32),
      rot_HxDxRxN,
    )
    x_BxLxHxRxN = jnp.concatenate([x_BxLxHxRxN, -x_BxLxHxRxN], axis=-1)
    bucket_BxLxHxR = jnp.argmax(x_BxLxHxRxN, axis=-1).astype(jnp.int32)
    return bucket_BxLxHxR.transpose(0, 2, 3, 1)

  def __call__(
    self, q_BxLxHxD, k_BxMxHxD, v_BxMxHxD, mask, *, rngs=None, memory=None
  ):
    del k_BxMxHxD, memory  # shared_qk: the keys are the normalised queries.
    b, length, h, d = q_BxLxHxD.shape
    r = self.num_hashes
    rot_key, drop_key = (None, None)
    if rngs is not None:
      rot_key, drop_key = jax.random.split(rngs)
    bucket_BxHxRxL = self.hash_buckets(q_BxLxHxD, self.rotation_key(rot_key))

    # Pad to a multiple of the chunk. Sort by (bucket, position), padded
    # tokens after every real one (sort bucket N, by position), so a padded
    # token never moves a real token's chunk; they keep their hash bucket
    # for the visibility test. perm[s] = original position of sorted s.
    c = min(self.chunk_size, length)
    padded = -(-length // c) * c
    n = padded // c
    extra = padded - length
    valid_BxL = key_valid_BxM(mask, b, length)
    valid_BxP = jnp.pad(valid_BxL, ((0, 0), (0, extra)))
    bucket_BxHxRxP = jnp.pad(
      bucket_BxHxRxL, ((0, 0), (0, 0), (0, 0), (0, extra))
    )
    sort_bucket_BxHxRxP = jnp.where(
      valid_BxP[:, None, None, :], bucket_BxHxRxP, self.buckets_for(length)
    )
    pos_P = jnp.arange(padded, dtype=jnp.int32)
    perm_BxHxRxP = jnp.argsort(sort_bucket_BxHxRxP * padded + pos_P, axis=-1)
    unperm_BxHxRxP = jnp.argsort(perm_BxHxRxP, axis=-1)

    q32_BxLxHxD = q_BxLxHxD.astype(jnp.float32)
    norm_BxLxHx1 = jax.lax.rsqrt(
      jnp.maximum(jnp.sum(q32_BxLxHxD**2, -1, keepdims=True), 1e-12)
    )
    k_BxLxHxD = (q32_BxLxHxD * norm_BxLxHx1).astype(q_BxLxHxD.dtype)

    def sort_chunk(x_BxLxHxD):
      # [B, L, H, D] -> sorted and chunked [B, H, R, n, C, D].
      x_BxHx1xPxD = jnp.pad(
        x_BxLxHxD.transpose(0, 2, 1, 3), ((0, 0), (0, 0), (0, extra), (0, 0))
      )[:, :, None]
      x_BxHxRxPxD = jnp.take_along_axis(
        x_BxHx1xPxD, perm_BxHxRxP[..., None], axis=3
      )
      return x_BxHxRxPxD.reshape(b, h, r, n, c, d)

    def look_back(x_BxHxRxnxCxX):
      # Keys of a chunk: itself then the previous chunk (wrapping round).
      if n == 1:
        return x_BxHxRxnxCxX
      prev = jnp.roll(x_BxHxRxnxCxX, 1, axis=3)
      return jnp.concatenate([x_BxHxRxnxCxX, prev], axis=4)

    sq_BxHxRxnxCxD = sort_chunk(q_BxLxHxD)
    sk_BxHxRxnxKxD = look_back(sort_chunk(k_BxLxHxD))
    sv_BxHxRxnxKxD = look_back(sort_chunk(v_BxMxHxD))
    spos_BxHxRxnxC = perm_BxHxRxP.reshape(b, h, r, n, c)
    sbucket_BxHxRxnxC = jnp.take_along_axis(
      bucket_BxHxRxP, perm_BxHxRxP, axis=-1
    ).reshape(b, h, r, n, c)
    svalid_BxHxRxnxC = jnp.take_along_axis(
      jnp.broadcast_to(valid_BxP[:, None, None, :], perm_BxHxRxP.shape),
      perm_BxHxRxP,
      axis=-1,
    ).reshape(b, h, r, n, c)
    kpos_BxHxRxnxK = look_back(spos_BxHxRxnxC)
    kbucket_BxHxRxnxK = look_back(sbucket_BxHxRxnxC)
    kvalid_BxHxRxnxK = look_back(svalid_BxHxRxnxC)

    allowed_BxHxRxnxCxK = (
      sbucket_BxHxRxnxC[..., :, None] == kbucket_BxHxRxnxK[..., None, :]
    ) & kvalid_BxHxRxnxK[..., None, :]
    if mask.causal:
      allowed_BxHxRxnxCxK &= (
        kpos_BxHxRxnxK[..., None, :] <= spos_BxHxRxnxC[..., :, None]
      )
    is_self_BxHxRxnxCxK = (
      kpos_BxHxRxnxK[..., None, :] == spos_BxHxRxnxC[..., :, None]
    )

    logits_BxHxRxnxCxK = jnp.einsum(
      'bhrncd,bhrnkd->bhrnck',
      sq_BxHxRxnxCxD,
      sk_BxHxRxnxKxD,
      preferred_element_type=jnp.float32,
    ) * self.scale - jnp.where(is_self_BxHxRxnxCxK, SELF_PENALTY, 0.0)
    if self.dedup and r > 1:
      count_BxHxRxnxCxK = round_counts(
        bucket_BxHxRxP, unperm_BxHxRxP // c, perm_BxHxRxP, n, look_back
      )
      logits_BxHxRxnxCxK -= jnp.where(
        allowed_BxHxRxnxCxK,
        jnp.log(jnp.maximum(count_BxHxRxnxCxK, 1).astype(jnp.float32)),
        0.0,
      )
    weights_BxHxRxnxCxK, lse_BxHxRxnxC = softmax_with_lse(
      logits_BxHxRxnxCxK, allowed_BxHxRxnxCxK
    )
    weights_BxHxRxnxCxK = dropout(
      weights_BxHxRxnxCxK, self.dropout_rate, drop_key
    )
    out_BxHxRxnxCxD = jnp.einsum(
      'bhrnck,bhrnkd->bhrncd',
      weights_BxHxRxnxCxK.astype(v_BxMxHxD.dtype),
      sv_BxHxRxnxKxD,
      preferred_element_type=jnp.float32,
    )

    # Un-sort (gather with the inverse permutation), combine the rounds.
    out_BxHxRxPxD = jnp.take_along_axis(
      out_BxHxRxnxCxD.reshape(b, h, r, padded, d),
      unperm_BxHxRxP[..., None],
      axis=3,
    )
    lse_BxHxRxP = jnp.take_along_axis(
      lse_BxHxRxnxC.reshape(b, h, r, padded), unperm_BxHxRxP, axis=-1
    )
    round_w_BxHxRxP = jax.nn.softmax(lse_BxHxRxP, axis=2)
    out_BxHxPxD = jnp.sum(round_w_BxHxRxP[..., None] * out_BxHxRxPxD, axis=2)
    out_BxLxHxD = out_BxHxPxD[:, :, :length].transpose(0, 2, 1, 3)
    return out_BxLxHxD.astype(self.dtype), {}


def round_counts(bucket_BxHxRxP, chunk_BxHxRxP, perm_BxHxRxP, n, look_back):
  """int32[B, H, R, n, C, K]: in how many rounds each gathered pair is seen.

  For the pair (query i, key j) at sorted slots of round r, N_ij counts the
  rounds r' in which j is in i's bucket and in i's chunk or the previous one
  (the pair is attended in r', up to padding and causal masks, which do not
  depend on the round). Each token's rounds are coded bucket * n + chunk
  (an [R] vector per token); i's window in r' is its own code or its bucket
  with the previous chunk, (chunk - 1) mod n.

  look_back: the core's [.., n, C, X] -> [.., n, K, X] key gather.
  """
  b, h, r, p = bucket_BxHxRxP.shape
  c = p // n
  code_BxHxRxP = bucket_BxHxRxP * n + chunk_BxHxRxP
  prev_BxHxRxP = bucket_BxHxRxP * n + (chunk_BxHxRxP - 1) % n

  def sorted_by_round(x_BxHxRxP):
    # [B, H, R', P] -> [B, H, R, n, C, R']: every round's code of the token
    # at each sorted slot of round r.
    x_BxHx1xPxR = x_BxHxRxP.transpose(0, 1, 3, 2)[:, :, None]
    x_BxHxRxPxR = jnp.take_along_axis(
      x_BxHx1xPxR, perm_BxHxRxP[..., None], axis=3
    )
    return x_BxHxRxPxR.reshape(b, h, r, n, c, r)

  qcode_BxHxRxnxCxR = sorted_by_round(code_BxHxRxP)
  qprev_BxHxRxnxCxR = sorted_by_round(prev_BxHxRxP)
  kcode_BxHxRxnxKxR = look_back(sorted_by_round(code_BxHxRxP))
  kcode_BxHxRxnx1xKxR = kcode_BxHxRxnxKxR[..., None, :, :]
  seen_BxHxRxnxCxKxR = (
    kcode_BxHxRxnx1xKxR == qcode_BxHxRxnxCxR[..., :, None, :]
  ) | (kcode_BxHxRxnx1xKxR == qprev_BxHxRxnxCxR[..., :, None, :])
  return jnp.sum(seen_BxHxRxnxCxKxR, axis=-1, dtype=jnp.int32)


def softmax_with_lse(logits_XxCxK, allowed_XxCxK):
  """Masked softmax in float32 and its log-sum-exp, for any leading dims X.

  base.attend has no log-sum-exp, which the rounds' combination needs. A row
  with no allowed key gets zero weights and log-sum-exp EMPTY_LSE (finite
  values and gradients).
  """
  logits_XxCxK = jnp.where(allowed_XxCxK, logits_XxCxK, -1e30)
  top_XxCx1 = jax.lax.stop_gradient(
    jnp.max(logits_XxCxK, axis=-1, keepdims=True)
  )
  exp_XxCxK = jnp.where(allowed_XxCxK, jnp.exp(logits_XxCxK - top_XxCx1), 0.0)
  total_XxCx1 = jnp.sum(exp_XxCxK, axis=-1, keepdims=True)
  nonempty_XxCx1 = total_XxCx1 > 0
  safe_XxCx1 = jnp.where(nonempty_XxCx1, total_XxCx1, 1.0)
  weights_XxCxK = exp_XxCxK / safe_XxCx1
  lse_XxC = jnp.where(
    nonempty_XxCx1, top_XxCx1 + jnp.log(safe_XxCx1), EMPTY_LSE
  )[..., 0]
  return weights_XxCxK, lse_XxC
