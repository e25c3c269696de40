# Stand-in for the RBLN compiler's Python package (tests only: tools/rbln-compile's tests).
__version__ = "0.0-stub"
