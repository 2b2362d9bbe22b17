"""Deterministic, checkpointable, elastic delivery of dataset versions to training jobs.

    from dsbuild.loader import Loader, Mixture
    loader = Loader("catalog@v3", split="main/train", seed=17, batch_size=8, rank=r, world_size=W)
    for batch in loader: ...
    state = loader.state_dict()      # small JSON-safe dict; loader.load_state_dict(state) resumes exactly

Options (``LoaderOptions``, with their defaults and reasons) are documented in ``loader.options``; the
order of batches in ``loader.walk``; reading and verification in ``loader.read``; checkpoints in
``loader.state``; decoding in ``loader.decode``/``loader.backends``/``loader.audio``; the torch and JAX
adapters in ``loader.torch`` and ``loader.jax``; tensor/context/pipeline-parallel layouts (``Parallel``) in
``loader.parallel``.
"""

from dsbuild.loader.options import LoaderOptions
from dsbuild.loader.parallel import Parallel
from dsbuild.loader.pipeline import Loader, Mixture
from dsbuild.loader.state import LoaderState

__all__ = ["Loader", "LoaderOptions", "LoaderState", "Mixture", "Parallel"]
