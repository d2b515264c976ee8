"""Model names -> attention defaults, and per-(task, model) tuned overrides.

One place maps a model name to its attention core; task files call
`apply_model`. Attention options are the registry's constructor arguments
(models/attention/registry.py).
"""

import ml_collections

# Registry key -> `model.attention` block (core name + its options).
MODELS = {
    # The exact softmax attention as LRA measured it: einsum, explicit L x L.
    'transformer': {'name': 'softmax', 'implementation': 'einsum'},
    # The same function through jax.nn.dot_product_attention (cuDNN flash
    # attention on GPU). It has no attention dropout.
    'transformer_fused': {'name': 'softmax', 'implementation': 'fused'},
}

# (task, model) -> flattened overrides, the reference harness's per-model
# tuning (../shared/reference/lra_configs.md). Applied after the task's
# reference values, before presets.
TASK_OVERRIDES = {}


def known_models():
  return tuple(MODELS)


def apply_model(c, model_name):
  if model_name not in MODELS:
    raise ValueError(
        f'Unknown model {model_name!r}; known models: '
        f'{", ".join(MODELS)}.'
    )
  c.model_name = model_name
  c.model.attention = ml_collections.ConfigDict(dict(MODELS[model_name]))
  if MODELS[model_name].get('implementation') == 'fused':
    c.model.attention_dropout_rate = 0.0
  for key, value in TASK_OVERRIDES.get((c.task, model_name), {}).items():
    _set_flat(c, key, value)


def _set_flat(c, dotted, value):
  *parents, leaf = dotted.split('.')
  for p in parents:
    c = c[p]
  c[leaf] = value
