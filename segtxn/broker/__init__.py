"""The broker: topics and segments, producers, consumers, dispatch and the admin API."""
