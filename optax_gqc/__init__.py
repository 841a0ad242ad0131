"""optax_gqc: gradient-quality control as Optax transformations.

Adaptive gradient accumulation that steps the optimizer when the mean
microbatch gradient is good enough, decided on device.
"""

from optax_gqc import gates, schedules
from optax_gqc._accumulation import AccumulateState, DrawStats, Gate, accumulate, statistics
from optax_gqc._sgd_sai import ScaleByGsnrState, SgdSaiMomentumState, scale_by_gsnr, sgd_sai
from optax_gqc._wrappers import ScaleToNormState, gnr, gnts, sbc, scale_to_norm

__version__ = '0.1.0'

__all__ = [
    'AccumulateState',
    'DrawStats',
    'Gate',
    'ScaleByGsnrState',
    'ScaleToNormState',
    'SgdSaiMomentumState',
    'accumulate',
    'gates',
    'gnr',
    'gnts',
    'sbc',
    'scale_by_gsnr',
    'scale_to_norm',
    'schedules',
    'sgd_sai',
    'statistics',
]
