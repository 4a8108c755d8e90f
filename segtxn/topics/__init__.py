"""Topics in the metadata store: records, range segments, key routing and placement."""
