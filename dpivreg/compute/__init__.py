"""The pass layer: what one pass over the rows computes (:mod:`~dpivreg.compute.kernels`: fused per-row kernels, in
numba or numpy) and where the rows live (:mod:`~dpivreg.compute.backends`: row sources in memory and on Dask, passes
in blocks across threads or workers). Nothing here knows the design or the formula; the kernels read raw rows
(the privacy boundary runs through them: every sum they return is clipped or a data check).
"""
