"""From a frame and a formula to a design: formula parsing and replay, derived columns, the formulaic and patsy
builders, data checks, the missing-value policy and what is public (:mod:`~dpivreg.data.boundary`), public bounds
(:mod:`~dpivreg.data.bounds`), the design classes (:mod:`~dpivreg.data.design`, and on Dask
:mod:`~dpivreg.data.dask_design`) and the non-private 2SLS benchmark's cross-products
(:mod:`~dpivreg.data.cross_products`). These modules read raw rows; nothing they compute is published except
through the releases of the estimation stage or as labelled NON-PRIVATE diagnostics.
"""
