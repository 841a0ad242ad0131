"""optax_gqc: gradient-quality control as Optax transformations.

Adaptive gradient accumulation that steps the optimizer when the mean
microbatch gradient is good enough, decided on device.
"""

from optax_gqc import gates, sampling, schedules, study
from optax_gqc._accumulation import (
    AccumulateState,
    AccumulationTransformation,
    accumulate,
    update_and_apply,
)
from optax_gqc._alias import (
    gnr,
    gns,
    gnts,
    mht,
    noise_ratio_accumulation,
    norm_test_accumulation,
    sbc,
)
from optax_gqc._noise_scale import NoiseScaleState, noise_scale, noise_scale_estimates
from optax_gqc._recipes import (
    gnr_with_cosine_schedule,
    gnr_with_cosine_schedule_conventional_lr,
    gns_default,
    gns_with_cosine_schedule,
    gnts_with_cosine_schedule,
    gnts_with_cosine_schedule_conventional_lr,
    mht_with_warmup_schedule,
    sbc_with_polynomial_schedule,
    sbc_with_polynomial_schedule_conventional_lr,
    schedule_by_microbatch,
    scheduled_accumulation,
)
from optax_gqc._scale_to_norm import ScaleToNormState, scale_to_norm
from optax_gqc._sgd_sai import ScaleByGsnrState, SgdSaiMomentumState, scale_by_gsnr, sgd_sai
from optax_gqc._statistics import statistics
from optax_gqc.gates import DrawStats, Gate

__version__ = '0.3.0'

__all__ = [
    'AccumulateState',
    'AccumulationTransformation',
    'DrawStats',
    'Gate',
    'NoiseScaleState',
    'ScaleByGsnrState',
    'ScaleToNormState',
    'SgdSaiMomentumState',
    'accumulate',
    'gates',
    'gnr',
    'gnr_with_cosine_schedule',
    'gnr_with_cosine_schedule_conventional_lr',
    'gns',
    'gns_default',
    'gns_with_cosine_schedule',
    'gnts',
    'gnts_with_cosine_schedule',
    'gnts_with_cosine_schedule_conventional_lr',
    'mht',
    'mht_with_warmup_schedule',
    'noise_ratio_accumulation',
    'noise_scale',
    'noise_scale_estimates',
    'norm_test_accumulation',
    'sampling',
    'sbc',
    'sbc_with_polynomial_schedule',
    'sbc_with_polynomial_schedule_conventional_lr',
    'scale_by_gsnr',
    'scale_to_norm',
    'schedule_by_microbatch',
    'scheduled_accumulation',
    'schedules',
    'sgd_sai',
    'statistics',
    'study',
    'update_and_apply',
]
