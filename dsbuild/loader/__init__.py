"""Deterministic, checkpointable, elastic delivery of dataset versions to training jobs.

    from dsbuild.loader import Loader, Mixture
    loader = Loader("catalog@v3", split="main/train", seed=17, batch_size=8, rank=r, world_size=W)
    for batch in loader: ...
    state = loader.state_dict()      # small JSON-safe dict; loader.load_state_dict(state) resumes exactly
"""

from dsbuild.loader.loader import Loader, LoaderOptions, Mixture
from dsbuild.loader.state import LoaderState

__all__ = ["Loader", "LoaderOptions", "LoaderState", "Mixture"]
