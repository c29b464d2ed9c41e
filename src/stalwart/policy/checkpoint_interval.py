"""The optimum compute time between checkpoints, in closed form (pure arithmetic, no validation).

* Young, J. W. "A first order approximation to the optimum checkpoint interval", CACM 17(9), 1974:
  ``tau = sqrt(2 * delta * M)``.
* Daly, J. T. "A higher order estimate of the optimum checkpoint interval for restart dumps",
  Future Generation Computer Systems 22(3), 2006:
  ``tau = sqrt(2 delta M) * (1 + sqrt(delta/(2M))/3 + (delta/(2M))/9) - delta`` for ``delta < 2M``,
  ``tau = M`` otherwise.

``delta`` is what one checkpoint costs the training loop (the stall, with two-phase saves) and ``M``
the mean time between the failures the checkpoint has to cover, both in seconds and positive.
The one copy of this arithmetic: :mod:`stalwart.account.ettr` (which checks its inputs and reports
bad ones as configuration errors) and the checkpoint interval advisor both call it.
"""

from __future__ import annotations

import math


def young_interval(cost_s: float, mtbf_s: float) -> float:
    """Young (1974): ``sqrt(2 * delta * M)``."""
    return math.sqrt(2.0 * cost_s * mtbf_s)


def daly_interval(cost_s: float, mtbf_s: float) -> float:
    """Daly (2006) higher-order optimum; the MTBF itself once a checkpoint costs two MTBFs or more."""
    if cost_s >= 2.0 * mtbf_s:
        return mtbf_s
    x = cost_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * cost_s * mtbf_s) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - cost_s
