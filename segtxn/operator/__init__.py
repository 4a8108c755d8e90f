"""The Kubernetes operator: custom resources rendered (pure) and reconciled (Kopf).

``render`` has no dependency beyond the standard library; ``handlers`` needs Kopf (the
``operator`` extra) and talks to segtxn only through its admin API (``segtxn.client``).
"""
