"""whyidle: why is my GPU idle, and what do I change?

Kept import-light on purpose: the bootstrap imports ``whyidle.instrument`` inside every Python
process of an observed command, so this module must not import numpy, rich or any framework.
"""

__version__ = "0.1.0"
