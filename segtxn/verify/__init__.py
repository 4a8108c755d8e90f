"""Verification: a transactional workload, a PySpark data source and the guarantee checker.

``segtxn verify run`` drives a consume-transform-produce pipeline and records what every
client did (:mod:`segtxn.verify.history`); ``segtxn verify check`` reads the topics back
through Spark (:mod:`segtxn.verify.source`) and proves, or disproves, the guarantees
(:mod:`segtxn.verify.checker`). ``segtxn demo`` runs both.
"""
