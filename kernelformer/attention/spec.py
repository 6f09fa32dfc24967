"""``AttentionSpec``: what the registry knows about one attention mechanism.

Each mechanism module of this package exports its specs as ``SPECS`` (a tuple); ``kernelformer.registry``
collects them, and ``kernelformer.plugins.register_mechanism`` adds a user's. The modules themselves never
import the registry.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import flax.linen as nn


@dataclasses.dataclass(frozen=True)
class AttentionSpec:
  """What the registry knows about one mechanism."""

  name: str
  # Flax module class; its dataclass fields are the options it reads from the attention config.
  module: type[nn.Module]
  # Fixed keyword arguments that distinguish this name from others sharing the module class
  # (e.g. component='positive', weights='orthogonal').
  fixed: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  paper: str = ''            # paper and equation, for docs/kernels.md
  approximates: str = ''     # the kernel it computes or estimates
  complexity: str = ''       # time / space, as in table 1 of the kernel-learning paper
  learnable: str = '-'       # learnable parameters beyond q/k/v projections
  aliases: tuple[str, ...] = ()
  # Relative-position bias (Luo et al. 2021): True if the module accepts ``position_bias``; True in
  # ``requires_position_bias`` if the mechanism is defined with one (nprf-rpe), so the encoder creates it.
  supports_position_bias: bool = False
  requires_position_bias: bool = False
  # Non-empty where the mechanism depends on the sequence's absolute length or positions *by definition*
  # (the reason, one line; docs/kernels.md lists these). Every other mechanism gives the same output on
  # the real tokens whether a sequence is padded to L or to 4L (tests/attention/test_padding_invariance.py).
  length_dependent: str = ''
