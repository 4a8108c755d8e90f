"""segtxn: transactional streaming on scalable topics, with metadata-driven transactions."""

__version__ = "0.1.0"
