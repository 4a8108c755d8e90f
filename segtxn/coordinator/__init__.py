"""Transaction coordinators: v5 (metadata records) now; v4 (a log) in a later issue."""
