"""Types of the compiled Silero network (media/_silero.c)."""

import numpy as np
import numpy.typing as npt

SUPPORTED: bool

def window_probability(
    weights: npt.NDArray[np.float32],
    window: npt.NDArray[np.float32],
    state: npt.NDArray[np.float32],
    /,
) -> float: ...
def packed_floats() -> int: ...
