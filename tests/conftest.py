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

# A test that leaves config.data.data_dir at its default writes into a throw-away folder, never into
# the user's ~/.cache/kernelformer/data (kernelformer/data_location.py); subprocesses inherit it.
if 'KERNELFORMER_DATA' not in os.environ:
  import atexit  # noqa: E402
  import shutil  # noqa: E402
  import tempfile  # noqa: E402
  os.environ['KERNELFORMER_DATA'] = tempfile.mkdtemp(prefix='kernelformer-test-data-')
  atexit.register(shutil.rmtree, os.environ['KERNELFORMER_DATA'], True)

import jax  # noqa: E402

jax.config.update('jax_default_matmul_precision', 'highest')

from absl import flags  # noqa: E402

# grain and our scripts read absl flags; tests never parse a command line.
if not flags.FLAGS.is_parsed():
  flags.FLAGS.mark_as_parsed()
