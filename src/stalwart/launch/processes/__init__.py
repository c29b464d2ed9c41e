"""This node's worker processes: the group of workers of an attempt (``worker_group.py``), the warm
pool and its fork server that start them without paying Python's and torch's start-up again, and
the bootstrap every worker runs before its script (``bootstrap.py``)."""
