"""mamba: chunked scan = unchunked = a float64 step loop, its hand-written
backward = autodiff of a plain step loop; init; padding; memory."""

import math

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lra.errors import UserError
from models.attention import Mask
from models.attention.memory import compiled_memory
from models.attention.registry import get_core_class
import models.mixers.mamba  # noqa: F401 (registers 'mamba')
from models.mixers.mamba import Mamba, selective_scan

B, E, N = 2, 8, 4
# Read by tests/test_mixer_suite.py: small, fast options for its runs.
SUITE = dict(opts={'state_size': 4, 'chunk_size': 16})


def make(seed=0, dtype=jnp.float32, emb_dim=E, **opts):
  opts.setdefault('state_size', N)
  return Mamba(
    emb_dim=emb_dim,
    num_heads=2,
    max_length=128,
    dropout_rate=0.0,
    dtype=dtype,
    rngs=nnx.Rngs(seed),
    **opts,
  )


def normal(seed, *shape):
  """float32 normal numbers (numpy: eager jax draws compile per shape)."""
  return np.random.default_rng(seed).standard_normal(shape, np.float32)


def inputs(length, seed=0, batch=B):
  return normal(seed, batch, length, E)


def padding(lengths, length):
  return np.arange(length)[None, :] < np.asarray(lengths)[:, None]


def runner(mixer, causal):
  """jit(x, pad -> y); one compiled program per shape."""
  return jax.jit(lambda x, pad: mixer(x, Mask(pad, causal))[0])


def f64(t):
  return np.asarray(t, np.float64)


def softplus(t):
  return np.logaddexp(0.0, t)


def silu(t):
  return t / (1 + np.exp(-t))


def direction_loop(p, x, real):
  """One direction written out step by step in float64 numpy:
  conv, SiLU, dt/B/C, h_t = exp(dt A) h + dt B x, y = C . h + D x."""
  w, bias = f64(p.conv_KxI[...]), f64(p.conv_bias_I[...])
  k = w.shape[0]
  b, length, inner = x.shape
  conv = np.tile(bias, (b, length, 1))
  for t in range(length):
    for j in range(k):
      s = t - k + 1 + j
      if s >= 0:
        conv[:, t] += w[j] * x[:, s]
  u = silu(conv) * real[..., None]
  r, n = p.rank, p.state
  if p.selective:
    dbl = u @ f64(p.x_proj.kernel[...])
    dt = softplus(dbl[..., :r] @ f64(p.dt_proj.kernel[...]) + f64(p.dt_bias_I))
    bm, cm = dbl[..., r : r + n], dbl[..., r + n :]
  else:  # the ablation: dt, B, C the same at every position
    dt = np.broadcast_to(softplus(f64(p.dt_bias_I)), u.shape)
    bm = np.broadcast_to(f64(p.b_N), (b, length, n))
    cm = np.broadcast_to(f64(p.c_N), (b, length, n))
  dt = dt * real[..., None]
  a = -np.exp(f64(p.a_log_IxN[...]))
  h = np.zeros((b, inner, n))
  y = np.zeros((b, length, inner))
  for t in range(length):
    h = np.exp(dt[:, t, :, None] * a) * h
    h = h + (dt[:, t] * u[:, t])[..., None] * bm[:, t, None, :]
    y[:, t] = np.einsum('bin,bn->bi', h, cm[:, t])
  return y + f64(p.d_I[...]) * u


def reference(m, x, pad, causal):
  """The whole mixer in float64 numpy from the module's own parameters."""
  x = f64(x)
  b, length, _ = x.shape
  real = np.ones((b, length)) if pad is None else f64(pad)
  xz = (x * real[..., None]) @ f64(m.in_proj.kernel[...])
  xs, z = xz[..., : m.inner] * real[..., None], xz[..., m.inner :]
  y = direction_loop(m.fwd, xs, real)
  if not causal:
    y = y + direction_loop(m.bwd, xs[:, ::-1], real[:, ::-1])[:, ::-1]
  return (y * silu(z)) @ f64(m.out_proj.kernel[...]) * real[..., None]


@pytest.mark.parametrize('causal', [False, True])
@pytest.mark.parametrize(
  'length,chunk,selective', [(37, 8, True), (100, 64, True), (37, 8, False)]
)
def test_chunked_scan_equals_step_loop(length, chunk, selective, causal):
  m = make(chunk_size=chunk, selective=selective)
  x = inputs(length, seed=1)
  pad = padding([length, 20], length)
  got = f64(runner(m, causal)(x, pad))
  ref = reference(m, x, pad, causal)
  scale = np.abs(ref).max()
  assert scale > 1e-2
  np.testing.assert_allclose(got, ref, atol=1e-5 * scale)


def scan_inputs(length, batch=(2,), inner=6, n=5):
  """Random selective_scan inputs [*batch, L, .], with identity steps
  (dt = 0) inside, as padding gives; A [*batch, I, N]."""
  u = normal(1, *batch, length, inner)
  dt = np.logaddexp(0, normal(2, *batch, length, inner) - 2)
  dt = dt * (np.arange(length) % 5 != 3)[:, None]
  bm, cm = normal(3, 2, *batch, length, n)
  a = -np.exp(normal(4, *batch, inner, n))
  return u, dt, a, bm, cm


# (L, chunk): one block per chunk, chunks of several blocks (20 = 2 x 10,
# 64 = 4 x 16), L not a multiple of the chunk, one chunk over all of L.
CHUNKINGS = [(37, 8), (37, 20), (100, 64), (100, 100)]


def _kernel(name):
  """A scan_kernel parameter; the C++ one is skipped, with the reason,
  on a machine where it cannot be built (no compiler)."""
  from models.mixers import mamba_native

  why = mamba_native.available() if name == 'native' else ''
  return pytest.param(
    name, marks=pytest.mark.skipif(bool(why), reason=f'C++ scan: {why}')
  )


KERNELS = [_kernel('xla'), _kernel('native')]


@pytest.mark.parametrize('kernel', KERNELS)
@pytest.mark.parametrize('length,chunk', CHUNKINGS)
def test_chunked_scan_equals_unchunked(length, chunk, kernel):
  """selective_scan in chunks = one chunk over L = the float64 loop,
  with identity steps (dt = 0) inside, as padding gives; one A [I, N]
  broadcast over the batch; the XLA scan and the C++ one."""
  u, dt, a, bm, cm = scan_inputs(length)
  a = a[0]
  both = jax.jit(
    lambda *t: [selective_scan(*t, c, kernel) for c in (chunk, length)]
  )
  got, whole = map(f64, both(u, dt, a, bm, cm))
  np.testing.assert_allclose(got, whole, rtol=1e-5, atol=1e-5)
  u, dt, a, bm, cm = map(f64, (u, dt, a, bm, cm))
  b, _, inner = u.shape
  h = np.zeros((b, inner, a.shape[-1]))
  for t in range(length):
    h = np.exp(dt[:, t, :, None] * a) * h
    h = h + (dt[:, t] * u[:, t])[..., None] * bm[:, t, None, :]
    ref_t = np.einsum('bin,bn->bi', h, cm[:, t])
    np.testing.assert_allclose(got[:, t], ref_t, rtol=1e-5, atol=1e-5)


def step_loop_scan(u, dt, a, bm, cm):
  """The recurrence as a plain jax.lax.scan over L (autodiff's backward)."""

  def step(h, xs):
    u_t, dt_t, b_t, c_t = xs
    h = (
      jnp.exp(dt_t[..., None] * a) * h
      + (dt_t * u_t)[..., None] * b_t[..., None, :]
    )
    return h, jnp.einsum('...in,...n->...i', h, c_t)

  xs = [jnp.moveaxis(t, -2, 0) for t in (u, dt, bm, cm)]
  h = jnp.zeros(u.shape[:-2] + a.shape[-2:])
  return jnp.moveaxis(jax.lax.scan(step, h, xs)[1], 0, -2)


@pytest.mark.parametrize('kernel', KERNELS)
@pytest.mark.parametrize('length,chunk', CHUNKINGS)
@pytest.mark.parametrize('batch', [(2,), (1,), (2, 3)])
def test_scan_gradients_equal_autodiff(length, chunk, batch, kernel):
  """The hand-written backwards (the XLA scan's custom VJP, the C++
  kernel's) = jax's autodiff of a plain step loop, for every input, with a
  batch of one (its axis dropped inside) and two batch dims (A broadcast
  along the second)."""
  u, dt, a, bm, cm = scan_inputs(length, batch)
  if len(batch) == 2:
    a = a[:, :1]  # [2, 1, I, N]: one A for the 3 of each row
  w = normal(5, *u.shape)  # the cotangent of y

  def grads(scan):
    loss = lambda *t: jnp.sum(scan(*t) * w)  # noqa: E731
    return jax.jit(jax.grad(loss, argnums=range(5)))(u, dt, a, bm, cm)

  got = grads(lambda *t: selective_scan(*t, chunk, kernel))
  ref = grads(step_loop_scan)
  for name, g, r in zip(('u', 'dt', 'a', 'b', 'c'), got, ref):
    assert g.shape == r.shape, name
    scale = np.abs(f64(r)).max()
    np.testing.assert_allclose(f64(g), f64(r), atol=2e-5 * scale, err_msg=name)


def test_initialisation():
  m = make(state_size=16)
  assert m.fwd.rank == math.ceil(E / 16) == 1 and m.inner == 2 * E
  for p in (m.fwd, m.bwd):
    a = -np.exp(f64(p.a_log_IxN[...]))
    np.testing.assert_allclose(
      a, -np.broadcast_to(np.arange(1, 17), (2 * E, 16))
    )
    np.testing.assert_array_equal(f64(p.d_I[...]), 1.0)
    dt = softplus(f64(p.dt_bias_I[...]))
    assert dt.min() >= 0.001 * (1 - 1e-5) and dt.max() <= 0.1 * (1 + 1e-5)
    # log-uniform over the range: both decades are hit.
    assert dt.min() < 0.004 and dt.max() > 0.03
    bound = 1.0  # R^-1/2, R = 1
    w = f64(p.dt_proj.kernel[...])
    assert np.abs(w).max() <= bound and w.min() < 0 < w.max()
  assert m.state_size() == 2 * E * (16 + 4 - 1)
  assert not np.allclose(f64(m.fwd.dt_bias_I), f64(m.bwd.dt_bias_I))


@pytest.mark.parametrize('causal', [False, True])
def test_padding_is_invisible(causal):
  length, short = 24, 13
  m = make(chunk_size=8)
  run = runner(m, causal)
  x = inputs(length, seed=2)
  pad = padding([length, short], length)
  out = f64(run(x, pad))
  # Any padded content: same real outputs.
  noise = 30 * normal(3, *x.shape)
  out2 = f64(run(np.where(pad[..., None], x, noise), pad))
  np.testing.assert_allclose(out2, out, atol=1e-6)
  # The padded example's real outputs are those of its tokens alone
  # (the loop without padding).
  alone = reference(m, x[1:, :short], None, causal)
  np.testing.assert_allclose(out[1, :short], alone[0], atol=1e-5)
  np.testing.assert_array_equal(out[1, short:], 0.0)
  # An example with no real token gives zeros, with finite gradients.
  empty = padding([length, 0], length)
  out = f64(run(x, empty))
  np.testing.assert_array_equal(out[1], 0.0)
  if causal:  # the bidirectional program covers both directions
    return
  grad = jax.jit(jax.grad(lambda x: jnp.sum(run(x, empty) ** 2)))(x)
  assert np.isfinite(np.asarray(grad)).all()
  np.testing.assert_array_equal(np.asarray(grad)[1], 0.0)
  assert np.abs(np.asarray(grad)[0]).sum() > 0


def test_causal_by_gradient():
  length = 37
  m = make(chunk_size=8)
  x = inputs(length, seed=4)
  pad = padding([length, 30], length)
  ts = (0, 7, 8, 20, 36)

  @jax.jit
  def time_gradients(x):
    out, pull = jax.vjp(lambda x: m(x, Mask(pad, True))[0], x)
    onehot_TxL = jax.nn.one_hot(jnp.asarray(ts), length)
    cts = onehot_TxL[:, None, :, None] * jnp.ones_like(out)[None]
    (g_TxBxLxE,) = jax.vmap(pull)(cts)
    return jnp.abs(g_TxBxLxE[:, 0]).sum(-1)  # example 0, no padding

  g_TxL = np.asarray(time_gradients(x))
  for row, t in zip(g_TxL, ts):
    assert (row[t + 1 :] == 0).all(), t  # nothing after t
    assert (row[: t + 1] > 0).all(), t  # every earlier token


def test_bfloat16_and_jit():
  length = 37
  x = inputs(length, seed=5)
  pad = padding([length, 20], length)
  ref = f64(runner(make(chunk_size=8), False)(x, pad))
  m = make(chunk_size=8, dtype=jnp.bfloat16)
  graphdef, state = nnx.split(m)

  @jax.jit
  def f(state, x, pad):
    return nnx.merge(graphdef, state)(x, Mask(pad, False))[0]

  out = f(state, x.astype(jnp.bfloat16), pad)
  assert out.dtype == jnp.bfloat16
  out = f64(out)
  assert np.isfinite(out).all()
  np.testing.assert_allclose(out, ref, atol=0.05 * np.abs(ref).max())


def test_memory_is_linear_in_length():
  """XLA's temp bytes of forward + backward (w.r.t. x: the whole backward
  scan) grow linearly in L, by less than one [I, N] state per position
  (what a differentiated step loop keeps at least): the backward recomputes
  each block's states from one kept per chunk, also with one chunk over all
  of L. N = 64 > I = 32 makes the states outweigh the rest."""
  emb, n = 16, 64

  def temp(length, chunk):
    mixer = make(emb_dim=emb, state_size=n, chunk_size=chunk)
    graphdef, state = nnx.split(mixer)

    def loss(x, state):
      return jnp.sum(nnx.merge(graphdef, state)(x, Mask(None, True))[0])

    x = jax.ShapeDtypeStruct((1, length, emb), jnp.float32)
    step = jax.jit(jax.grad(loss))  # w.r.t. x: the whole backward scan
    return compiled_memory(step.lower(x, state).compile())['temp']

  state_bytes = 2 * emb * n * 4  # one position's float32 [I, N] state
  t256, t512, whole = temp(256, 16), temp(512, 16), temp(512, 512)
  print(f'mamba temp bytes: L=256 {t256}, L=512 {t512}, one chunk {whole}')
  assert 0 < t512 - t256 < 256 * state_bytes
  assert whole - t256 < 256 * state_bytes


def test_options_and_registry():
  assert get_core_class('mamba') is Mamba
  assert Mamba.is_mixer and Mamba.supports_causal
  bad = (
    {'expand': 0},
    {'state_size': 1.5},
    {'chunk_size': 0},
    {'dt_min': 'small'},
    {'dt_min': 0.5, 'dt_max': 0.1},
    {'selective': 'no'},
    {'scan_kernel': 'cuda'},
  )
  for opts in bad:
    with pytest.raises(UserError, match='mamba'):
      make(**opts)


def test_without_selection_dt_b_c_do_not_depend_on_the_input():
  """selective=False: no x_proj / dt_proj; the scan's dt, B and C are the
  same at every real position whatever the input (a time-invariant SSM),
  where the selective layer's vary; padded positions keep dt = 0."""
  lti, s6 = make(selective=False), make(selective=True)
  assert not hasattr(lti.fwd, 'x_proj') and hasattr(s6.fwd, 'x_proj')
  x = jnp.asarray(normal(4, 10, 3, 2 * E))  # [L, B, I] time-major
  keep = jnp.asarray(padding([10, 10, 6], 10).T.reshape(-1, 1))
  for m, invariant in ((lti, True), (s6, False)):
    _, dt, _, bm, cm = m.fwd.scan_inputs(x, keep)
    real = np.asarray(keep[:, 0])
    for t in (dt, bm, cm):
      t = np.asarray(t)[real]
      assert np.allclose(t, t[:1]) == invariant
    assert np.all(np.asarray(dt)[~real] == 0)


def step_loop_time_major(u_LxXxI, dt_LxXxI, a_XxNxI, b_LxXxN, c_LxXxN, chunk):
  """scan_time_major's contract written as one plain step per position
  (autodiff's backward): the reference the training test swaps in."""
  del chunk

  def step(h_XxNxI, xs):
    u_t, dt_t, b_t, c_t = xs
    h_XxNxI = (
      jnp.exp(dt_t[:, None, :] * a_XxNxI) * h_XxNxI
      + (dt_t * u_t)[:, None, :] * b_t[:, :, None]
    )
    return h_XxNxI, jnp.einsum('xni,xn->xi', h_XxNxI, c_t)

  h = jnp.zeros(a_XxNxI.shape, jnp.float32)
  return jax.lax.scan(step, h, (u_LxXxI, dt_LxXxI, b_LxXxN, c_LxXxN))[1]


def test_training_run_equals_the_step_loop_recurrence(tmp_path, monkeypatch):
  """Issue #33: a Mamba training run on MQAR (the task where it lagged)
  follows the same loss, step by step, with the chunked scan and its
  custom backward as with the recurrence written as one step per position
  and differentiated by jax: the fast scan changes no training."""
  from configs import mqar
  from lra import data as tasks
  from lra.train import batching, build, runtime, steps

  config = mqar.get_config('mamba,smoke')
  config.data_dir = str(tmp_path)
  config.learning_rate = 1e-2  # large steps: differences would grow
  task = tasks.get_task('mqar')
  task.ensure_prepared(str(tmp_path), config.data.to_dict(), False)
  data = runtime.load_data(config, task, progress=False)

  def losses():
    graphdef, state = build.create_state(config, task, None)
    step = steps.make_train_step(graphdef)
    out = []
    for i in range(12):
      batch = batching.training_batch(config, task, data, [], i)
      batch = {k: jnp.asarray(v) for k, v in batch.items()}
      state, metrics = step(state, batch, jax.random.key(i))
      out.append(float(metrics['loss']))
    return np.array(out)

  # Which scan each run traces, observed directly (issue #51: a check that
  # the two runs' losses differ proved nothing when both scans rounded
  # alike): the default run must trace the model's own scan, the second
  # the step loop, each at least once.
  default_scan_for, traced = models.mixers.mamba.scan_for, []

  def recording_scan_for(kernel):
    scan = default_scan_for(kernel)
    traced.append(scan)
    return scan

  def reference_scan(*args):
    traced.append(step_loop_time_major)
    return step_loop_time_major(*args)

  monkeypatch.setattr(models.mixers.mamba, 'scan_for', recording_scan_for)
  fast = losses()  # the default scan (the C++ kernel on a CPU)
  assert traced and step_loop_time_major not in traced
  del traced[:]
  monkeypatch.setattr(
    models.mixers.mamba, 'scan_for', lambda kernel: reference_scan
  )
  reference = losses()
  assert traced and set(traced) == {step_loop_time_major}  # swapped
  assert fast[-1] < fast[0] - 0.05  # it trains
  np.testing.assert_allclose(fast, reference, rtol=2e-5)


def test_gradient_probe_finds_the_unused_direction(tmp_path):
  """experiments.mamba_recall.gradients' table (issue #33's vanishing-gradient probe): in a
  causal Mamba the backward direction's parameters get exactly no gradient,
  the forward one's do, so a starved parameter shows."""
  from configs import mqar
  from experiments.mamba_recall.gradients import gradient_table
  from lra import data as tasks
  from lra.train import build, runtime

  config = mqar.get_config('mamba,smoke')
  config.data_dir = str(tmp_path)
  task = tasks.get_task('mqar')
  task.ensure_prepared(str(tmp_path), config.data.to_dict(), False)
  data = runtime.load_data(config, task, progress=False)
  graphdef, state = build.create_state(config, task, None)
  rows = gradient_table(graphdef, state, config, task, data, 2)
  grads = {name: g for name, g, _ in rows}
  fwd = [g for n, g in grads.items() if '.fwd.' in n]
  bwd = [g for n, g in grads.items() if '.bwd.' in n]
  assert fwd and bwd and len(fwd) == len(bwd)
  assert max(bwd) == 0.0 and min(fwd) > 0.0


def test_native_kernel_build_failure_says_why(tmp_path, monkeypatch):
  """No working compiler: available() gives one line naming the cause,
  'auto' falls back to the XLA scan, 'native' stops with one sentence."""
  from models.mixers import mamba_native

  before = mamba_native.available()
  monkeypatch.setenv('LRA_CACHE_DIR', str(tmp_path))
  monkeypatch.setenv('CXX', 'false')  # a "compiler" that always fails
  mamba_native.available.cache_clear()
  models.mixers.mamba._native_or_why.cache_clear()
  try:
    why = mamba_native.available()
    assert why == 'the C++ build (false) failed: exit status 1', why
    assert list(tmp_path.iterdir()) == []  # no half-written library left
    mm = models.mixers.mamba
    assert mm.scan_for('auto') is mm.scan_time_major
    with pytest.raises(UserError, match='scan_kernel=native cannot run'):
      mm.scan_for('native')
  finally:
    mamba_native.available.cache_clear()
    models.mixers.mamba._native_or_why.cache_clear()
  monkeypatch.undo()
  assert mamba_native.available() == before  # as before the test
