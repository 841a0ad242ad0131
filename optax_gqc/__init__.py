"""optax_gqc: gradient-quality control as Optax transformations.

Adaptive gradient accumulation that steps the optimizer when the mean
microbatch gradient is good enough, decided on device.
"""

from optax_gqc import gates, sampling, schedules
from optax_gqc._accumulation import (
    AccumulateState,
    DrawStats,
    Gate,
    accumulate,
    noise_scale_estimates,
    statistics,
)
from optax_gqc._sgd_sai import ScaleByGsnrState, SgdSaiMomentumState, scale_by_gsnr, sgd_sai
from optax_gqc._wrappers import (
    NoiseScaleState,
    ScaleToNormState,
    gnr,
    gns,
    gnts,
    mht,
    noise_scale,
    norm_test_accumulation,
    sbc,
    scale_to_norm,
)

__version__ = '0.1.0'

__all__ = [
    'AccumulateState',
    'DrawStats',
    'Gate',
    'NoiseScaleState',
    'ScaleByGsnrState',
    'ScaleToNormState',
    'SgdSaiMomentumState',
    'accumulate',
    'gates',
    'gnr',
    'gns',
    'gnts',
    'mht',
    'noise_scale',
    'noise_scale_estimates',
    'norm_test_accumulation',
    'sampling',
    'sbc',
    'scale_by_gsnr',
    'scale_to_norm',
    'schedules',
    'sgd_sai',
    'statistics',
]
