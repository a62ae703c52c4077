"""Types of the compiled echo gate kernels (media/_echo_kernels.c)."""

import numpy as np
import numpy.typing as npt

def prove_lags(
    window: npt.NDArray[np.float64],
    proof: npt.NDArray[np.float64],
    lag_erl: npt.NDArray[np.float64],
    spread: int,
    level: float,
    wobble: float,
    max_erl: float,
    min_erl: float,
    rise: float,
    floor: float,
    silence: float,
    bound_on: bool,
    allowed: bool,
    clean: bool,
    /,
) -> tuple[float, bool]: ...
