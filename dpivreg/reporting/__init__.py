"""What a fit shows and publishes: the results object and its summary (:mod:`~dpivreg.reporting.results`), table
formatting (:mod:`~dpivreg.reporting.tables`), release records (:mod:`~dpivreg.reporting.release`) and side-by-side
comparisons (:mod:`~dpivreg.reporting.comparison`). Formats what the earlier stages computed; computes no
statistic of its own.
"""
