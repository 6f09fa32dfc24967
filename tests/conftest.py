"""Test setup: 8 forced CPU devices (sharding tests), float32 matmuls at full precision, absl parsed."""
import os

# Must happen before jax is imported anywhere: lets the sharding tests build an 8-device mesh on CPU.
# The other flags make XLA:CPU compile fast rather than run fast: test shapes are tiny, so compilation
# dominates (about 2.5x less CPU for the attention tests), and they change no numerics we assert on.
os.environ.setdefault('XLA_FLAGS', ' '.join([
    '--xla_force_host_platform_device_count=8',
    '--xla_backend_optimization_level=0',
    '--xla_llvm_disable_expensive_passes=true',
    '--xla_cpu_use_fusion_emitters=false',
]))
os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import jax  # noqa: E402

jax.config.update('jax_default_matmul_precision', 'highest')

from absl import flags  # noqa: E402

# grain and our scripts read absl flags; tests never parse a command line.
if not flags.FLAGS.is_parsed():
  flags.FLAGS.mark_as_parsed()
