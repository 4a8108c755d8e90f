from tests.manifests.support import helm

__all__ = ["helm"]
