"""The package's version (read by records and the summary without importing the package)."""

__version__ = "0.1.0"
