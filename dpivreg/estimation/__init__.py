"""The private estimate: the working scale and its moment release (:mod:`~dpivreg.estimation.working_scale`), the
noise-aware moment solve (:mod:`~dpivreg.estimation.moments`), private clipping thresholds
(:mod:`~dpivreg.estimation.clipping`), DP-2S-GD itself (:mod:`~dpivreg.estimation.engine`), the public tuning of
its steps and schedule (:mod:`~dpivreg.estimation.tuning`) and the default's choices of T and estimator
(:mod:`~dpivreg.estimation.selection`).
"""
