"""The package version, in a module of its own so that an exported library can record it
without importing the package facade (``aicf_tvm/__init__.py``)."""

__version__ = "0.1.0"
