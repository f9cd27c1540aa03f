"""DP mechanisms: each module gives the data operation and the privacy event it costs.

`report_noisy_max` is deliberately not re-exported as a function: that name is the module.
"""

from privflow.privacy.mechanisms.dp_mog import MoGParams, dp_em_mog, dp_mog_event
from privflow.privacy.mechanisms.dp_stats import dp_mean_std, dp_stats_event
from privflow.privacy.mechanisms.gaussian import gaussian_event, gaussian_mechanism
from privflow.privacy.mechanisms.laplace import laplace_event, laplace_mechanism
from privflow.privacy.mechanisms.report_noisy_max import clipped_loglik_scores, rnm_event

__all__ = [
    "MoGParams",
    "clipped_loglik_scores",
    "dp_em_mog",
    "dp_mean_std",
    "dp_mog_event",
    "dp_stats_event",
    "gaussian_event",
    "gaussian_mechanism",
    "laplace_event",
    "laplace_mechanism",
    "rnm_event",
]
