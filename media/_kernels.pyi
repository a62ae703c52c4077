"""Types of the compiled media kernels (media/_kernels.c)."""

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
def pre_emphasis(
    x: npt.NDArray[np.float64], out: npt.NDArray[np.float64], coefficient: float, /
) -> None: ...
def ncc_peak(
    corr: npt.NDArray[np.float64],
    r: npt.NDArray[np.float64],
    n_c: int,
    c_energy: float,
    min_share: float,
    /,
) -> tuple[float, int]: ...
def polyphase_pcm16(
    x: npt.NDArray[np.float32],
    coefficients: npt.NDArray[np.float32],
    width: int,
    up: int,
    down: int,
    periods: int,
    /,
) -> bytes: ...
def lec_frame(
    seg: npt.NDArray[np.float64],
    w: npt.NDArray[np.float64],
    x: npt.NDArray[np.float64],
    r: npt.NDArray[np.float64],
    p: npt.NDArray[np.float64],
    forget: float,
    residual: npt.NDArray[np.float64],
    /,
) -> tuple[float, float, float]: ...
