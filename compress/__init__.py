"""compress: turn a trained transformer text classifier into deployable compressed
variants, benchmark every variant the same way, and pick the one to ship."""

__version__ = "0.1.0"
