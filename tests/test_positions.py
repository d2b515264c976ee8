"""Positions inside attention (models/positions.py): rotary and PIA.

The rotation against a complex-number reference in float64 numpy, its
offset-only scores, MultiHeadAttention against a numpy oracle of its
projections for both schemes, PIA's position-free values and residual
stream, and every registered core: it runs with rotary (at its exact limit,
equal to the dense oracle of the rotated projections) or refuses at
construction with one sentence. A core registered without
its own `rotary` declaration fails here; per-core settings are in each
core's SUITE (tests/test_attn_<name>.py).
"""

from attention_oracle import dense_reference, full_pattern, make, padding
from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from test_attention_suite import SUITE
from test_attn_reformer import reformer_reference
from test_models_tasks import task_config

from configs.base import get_base_config
from lra import data as tasks
from lra.errors import UserError
from lra.train import build
from models.attention import AttentionCore, Mask, known_cores
from models.attention.reformer import ReformerAttention
from models.attention.registry import get_core_class
from models.embeddings import Embedder, sinusoidal_LxE
from models.encoder import Encoder
from models.layers import MultiHeadAttention
from models.positions import pia_inputs, rotate

B, L, H, D = 2, 37, 2, 8
E = H * D
LENGTHS = (L, 20)

# Per-core settings (a core's SUITE in tests/test_attn_<name>.py):
# rotary_opts where the suite's exact limit is not the one used here
# (sparse_transformer's patterns are softmax at stride >= L; performer is
# compared with the oracle at many features, an estimate, not a limit; the
# recurrent cores without memory and without their relative positions are
# softmax attention); rotary_tol, the max abs error allowed against the
# oracle (default 2e-5); rotary_scale, the inputs' scale.
CORES = sorted(SUITE)


def complex_rotation(x, offset=0, sign=1):
  """R_m x in float64 by complex numbers: pair (2i, 2i+1) as x_2i + i x_2i+1
  times exp(i m theta_i), theta_i = 10000^(-2i/D) (sign=-1: R_m^-1 x)."""
  x = np.asarray(x, np.float64)
  d = x.shape[-1]
  z = x[..., 0::2] + 1j * x[..., 1::2]
  theta = 10000.0 ** (-np.arange(0, d, 2) / d)
  m = offset + np.arange(x.shape[1])
  z = z * np.exp(sign * 1j * m[:, None] * theta)[None, :, None, :]
  out = np.empty_like(x)
  out[..., 0::2], out[..., 1::2] = z.real, z.imag
  return out


def scores(q, k):
  return np.einsum('blhd,bmhd->bhlm', np.asarray(q), np.asarray(k))


def normal(seed, shape, scale=1.0):
  return scale * jax.random.normal(jax.random.key(seed), shape)


def test_rotate_matches_complex_reference_and_keeps_dtype():
  x = normal(0, (2, 50, 3, 8))
  for offset in (0, 100):
    np.testing.assert_allclose(
      rotate(x, offset), complex_rotation(x, offset), atol=1e-5
    )
  # Position 0 is the identity; norms are kept (orthogonal).
  np.testing.assert_array_equal(rotate(x)[:, 0], x[:, 0])
  np.testing.assert_allclose(
    jnp.linalg.norm(rotate(x, 7), axis=-1),
    jnp.linalg.norm(x, axis=-1),
    rtol=1e-5,
  )
  lo = rotate(x.astype(jnp.bfloat16))
  assert lo.dtype == jnp.bfloat16
  np.testing.assert_allclose(
    np.asarray(lo, np.float32), complex_rotation(x), atol=0.05
  )


def test_rotary_scores_depend_only_on_offsets():
  q, k = normal(1, (1, 40, 2, 8)), normal(2, (1, 40, 2, 8))
  base = scores(rotate(q), rotate(k))
  for shift in (1, 13, 200):
    np.testing.assert_allclose(
      scores(rotate(q, shift), rotate(k, shift)), base, atol=1e-4
    )
  # Not trivially so: the scores do depend on the offset ...
  assert np.abs(base - scores(q, k)).max() > 0.5
  # ... and shifting the queries alone changes them.
  assert np.abs(scores(rotate(q, 5), rotate(k)) - base).max() > 0.5
  # The same vector at every position: the score is a function of j - i.
  same = jnp.broadcast_to(q[:, :1], q.shape)
  s = scores(rotate(same), rotate(same))[0, 0]
  for offset in (0, 3, -7):
    diagonal = np.diagonal(s, offset)
    np.testing.assert_allclose(diagonal, diagonal[0], atol=1e-4)


def test_rotary_attention_is_shift_invariant_end_to_end():
  """Softmax attention on rotated q, k (the einsum and fused paths): every
  position shifted by a constant gives the same output."""
  q, k, v = (normal(s, (B, L, H, D)) for s in (3, 4, 5))
  pad = padding(LENGTHS, L)
  for impl in ('einsum', 'fused'):
    core = make_core({'name': 'softmax', 'implementation': impl})
    f = jax.jit(
      lambda s: core(rotate(q, s), rotate(k, s), v, Mask(pad, False))[0]
    )
    out = f(0)
    np.testing.assert_allclose(f(11), out, atol=1e-5)
    np.testing.assert_allclose(f(300), out, atol=1e-4)


def make_core(options):
  return make(options, num_heads=H, head_dim=D)


def options_for(name):
  """The core's options here: its rotary_opts, else the suite's exact
  limit, else the suite's options."""
  entry = SUITE[name]
  if 'rotary_opts' in entry:
    return entry['rotary_opts']
  return entry['exact'] if entry['exact'] is not None else entry['opts']


def attention(name, positions, options=None, **kw):
  """MultiHeadAttention of width E around core `name`, with the suite's
  hook for the exact limit's parameters."""
  options = options_for(name) if options is None else options
  mha = MultiHeadAttention(
    E,
    E,
    H,
    {'name': name, **options},
    max_length=64,
    dropout_rate=0.0,
    dtype=jnp.float32,
    rngs=nnx.Rngs(0),
    positions=positions,
    **kw,
  )
  if 'hook' in SUITE[name] and options == SUITE[name]['exact']:
    SUITE[name]['hook'](mha.core)
  return mha


def mha_oracle(mha, x, pad, positions):
  """MultiHeadAttention in float64 numpy from its weights: PIA positions on
  the query and key inputs, rotary on q and k, softmax over visible keys
  (Reformer's rule for a shared-qk core), the output projection."""
  x = np.asarray(x, np.float64)
  w = lambda layer: np.asarray(layer.kernel[...], np.float64)  # noqa: E731
  heads = lambda t: t.reshape(B, L, H, D)  # noqa: E731
  qk_in = x + sinusoidal_LxE(L, E) if positions == 'pia' else x
  q = heads(qk_in @ w(mha.query))
  k = q if mha.key is None else heads(qk_in @ w(mha.key))
  v = heads(x @ w(mha.value))
  if positions == 'rotary':
    q = complex_rotation(q)
    k = q if mha.key is None else complex_rotation(k)
  if mha.core.shared_qk:
    out = reformer_reference(q, v, pad, False)
  else:
    allowed = np.asarray(pad)[:, None, None, :] & full_pattern(L)
    out = dense_reference(q, k, v, allowed)
  return out.reshape(B, L, E) @ w(mha.out)


def run_mha(mha, x, pad):
  graphdef, state = nnx.split(mha)
  f = jax.jit(lambda s, x, p: nnx.merge(graphdef, s)(x, Mask(p, False))[0])
  return np.asarray(f(state, x, pad), np.float64)


@pytest.mark.parametrize(
  'name,positions',
  [('softmax', 'pia'), ('softmax', 'rotary'), ('reformer', 'pia')],
)
def test_attention_equals_numpy_oracle(name, positions):
  """q, k from the inputs plus positions (pia) or rotated (rotary), v never
  touched; the shared-qk path (reformer) rotates once."""
  mha = attention(name, positions)
  x, pad = normal(6, (B, L, E)), padding(LENGTHS, L)
  want = mha_oracle(mha, x, pad, positions)
  np.testing.assert_allclose(run_mha(mha, x, pad), want, atol=2e-5)
  # The positions matter: without them the output differs.
  plain = attention(name, 'none')
  nnx.update(plain, nnx.state(mha))
  assert np.abs(run_mha(plain, x, pad) - want).max() > 1e-2


def test_every_core_declares_rotary():
  """Each registered core states its rotary capability (not the default
  inherited from AttentionCore), with a reason when it refuses. Sequence
  mixers share SequenceMixer's refusal: they order tokens themselves."""
  for name in known_cores():
    cls = get_core_class(name)
    own = [c for c in cls.__mro__ if c is not AttentionCore]
    assert any('rotary' in vars(c) for c in own), name
    assert cls.rotary in ('scores', 'features', None), name
    if cls.rotary is None:
      assert any('rotary_refusal' in vars(c) for c in own), name


@pytest.mark.parametrize('name', CORES)
def test_rotary_runs_or_refuses(name):
  """Accepting cores at their exact limit equal the numpy oracle of the
  rotated projections (performer: an estimate at many features); refusing
  cores stop at construction with one sentence naming the core."""
  declared = get_core_class(name).rotary
  if declared is None:
    with pytest.raises(UserError, match=f"'{name}'.*rotary") as err:
      attention(name, 'rotary')
    assert '\n' not in str(err.value) and str(err.value).endswith('.')
    return
  mha = attention(name, 'rotary')
  assert mha.core.rotary == declared
  x = normal(7, (B, L, E), SUITE[name].get('rotary_scale', 1.0))
  pad = padding(LENGTHS, L)
  got = run_mha(mha, x, pad)
  assert np.isfinite(got).all()
  if 'rotary_opts' in SUITE[name] or SUITE[name]['exact'] is not None:
    real = np.asarray(pad)
    want = mha_oracle(mha, x, pad, 'rotary')
    err = np.abs(got - want)[real].max()
    assert err < SUITE[name].get('rotary_tol', 2e-5), err
    # Far closer to rotary attention than to the same without positions.
    plain = mha_oracle(mha, x, pad, 'none')
    assert err < 0.2 * np.abs(want - plain)[real].max(), err


def test_model_builder_refuses_rotary_before_training():
  """The trainer's model builder stops with the one sentence (train.py
  prints it and exits 2), before any step."""
  config = task_config('listops', 'linformer', **{'model.positions': 'rotary'})
  with pytest.raises(UserError, match="'linformer' cannot use rotary"):
    build.create_state(config, tasks.get_task('listops'), None)


def test_synthesizer_rotary_needs_the_dot_product():
  with pytest.raises(UserError, match='mix_dot_product'):
    attention('synthesizer', 'rotary', {'mode': 'dense'})
  mha = attention('synthesizer', 'rotary', {'mix_dot_product': True})
  assert mha.core.rotary == 'scores'


def test_rotary_needs_an_even_head_dim():
  with pytest.raises(UserError, match='even head dimension'):
    MultiHeadAttention(
      6,
      6,
      2,
      {'name': 'softmax'},
      max_length=8,
      dropout_rate=0.0,
      dtype=jnp.float32,
      rngs=nnx.Rngs(0),
      positions='rotary',
    )


def test_reformer_hashes_rotated_vectors_by_rotary_neighbours():
  """Shared q/k rotated once, then hashed: tokens i and i + 32 whose rotated
  vectors nearly coincide (the largest rotary score) though their raw
  vectors do not, share a bucket in almost every round; other pairs in
  about the chance rate."""
  core = ReformerAttention(
    num_heads=1,
    head_dim=D,
    max_length=64,
    dropout_rate=0.0,
    dtype=jnp.float32,
    rngs=nnx.Rngs(0),
    num_hashes=32,
    num_buckets=4,
  )
  u = np.asarray(normal(8, (32, D)))
  twins = np.concatenate([u, u + 0.05 * np.asarray(normal(9, (32, D)))])
  # Raw queries: the twins rotated back by their positions' angles.
  q = complex_rotation(twins[None, :, None, :], offset=0, sign=-1)
  q = jnp.asarray(q, jnp.float32)

  def rates(x):  # (twins, other pairs): how often they share a bucket
    bucket_RxL = np.asarray(core.hash_buckets(x, jax.random.key(1)))[0, 0]
    twin = (bucket_RxL[:, :32] == bucket_RxL[:, 32:]).mean()
    return twin, (bucket_RxL == np.roll(bucket_RxL, 17, axis=1)).mean()

  twin, other = rates(rotate(q))
  assert twin > 0.9 and other < 0.5, (twin, other)
  # Hashing the raw vectors would not find them.
  assert rates(q)[0] < twin - 0.3, rates(q)


def encoder(positions, num_layers=2):
  cfg = get_base_config().model
  cfg.update(
    ml_collections.ConfigDict(
      dict(
        num_layers=num_layers,
        emb_dim=E,
        qkv_dim=E,
        num_heads=H,
        mlp_dim=32,
        dropout_rate=0.0,
        attention_dropout_rate=0.0,
        pooling='mean',
        positions=positions,
      )
    )
  )
  return Encoder(
    cfg,
    vocab_size=10,
    max_length=L,
    pad_id=None,
    dtype=jnp.float32,
    rngs=nnx.Rngs(0),
  )


@pytest.mark.parametrize(
  'positions,position_free',
  [('pia', True), ('rotary', True), ('sinusoidal', False)],
)
def test_identical_tokens_carry_no_position_in_values(positions, position_free):
  """Every token the same: under pia and rotary the values, hence every
  layer's output and the residual stream, are the same at every position
  (q and k alone see positions); absolute positions (the control) differ."""
  enc = encoder(positions)
  graphdef, state = nnx.split(enc)
  tokens = jnp.full((1, L), 3, jnp.int32)
  x = jax.jit(lambda s, t: nnx.merge(graphdef, s)(t)[0])(state, tokens)
  spread = float(jnp.abs(x - x[:, :1]).max())
  if position_free:
    assert spread < 1e-5, spread
  else:
    assert spread > 1e-2, spread
  if positions == 'pia':  # the queries and keys do differ across positions
    mha = enc.blocks[0].attn
    h = enc.blocks[0].ln_attn(enc.embed.embed(tokens))
    for proj in (mha.query, mha.key):
      out = proj(pia_inputs(h))
      assert jnp.abs(out - out[:, :1]).max() > 0.1


@pytest.mark.parametrize('positions', ['sinusoidal2d', 'learned2d'])
@pytest.mark.parametrize('lead', [0, 1])
def test_2d_positions_are_a_row_part_plus_a_column_part(positions, lead):
  """pos(r, c) = row(r) + col(c) on a side x side image after `lead` CLS
  tokens: the difference between two columns is the same on every row."""
  side, dim = 4, 8
  emb = Embedder(
    10,
    dim,
    side * side + lead,
    positions,
    dtype=jnp.float32,
    rngs=nnx.Rngs(0),
  )
  zeros = jnp.zeros((1, side * side + lead, dim))
  pos = np.asarray(emb.add_positions(zeros)[0, lead:]).reshape(side, side, -1)
  np.testing.assert_allclose(
    pos[:, 1] - pos[:, 2],
    np.broadcast_to(pos[0, 1] - pos[0, 2], (side, dim)),
    atol=1e-6,
  )
  assert np.abs(pos[1, 0] - pos[2, 0]).max() > 1e-3  # rows differ
  # An offset reads the same table (segments of a recurrent encoder).
  tail = emb.add_positions(zeros[:, :5], offset=lead + 3)[0]
  np.testing.assert_allclose(tail, pos.reshape(side * side, -1)[3:8], atol=1e-6)
  with pytest.raises(UserError, match='square images'):
    Embedder(10, dim, 7, positions, dtype=jnp.float32, rngs=nnx.Rngs(0))
