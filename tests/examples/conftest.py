"""The operator's ``local`` fixture (a real broker and coordinator on the session's etcd),
for the ScalableTopic example."""

from tests.operator.conftest import local

__all__ = ["local"]
