"""What brokers, coordinators and clients agree on: names, ids, frames and error names.

Nothing here talks to a network or a store; it is shared by servers and the client, and the
client imports nothing else of the server side.
"""
