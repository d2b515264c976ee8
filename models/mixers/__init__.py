"""Sequence mixers: layers that replace a block's attention sub-layer and
read the block's input instead of q/k/v (the contract is models/mixers/
base.py). One mixer per module, registered with `@register('<name>')` in the
attention registry (models/attention/registry.py), which finds a mixer by its
module's name, so a new file here is a new model name with nothing else to
edit.
"""
