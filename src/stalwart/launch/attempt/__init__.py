"""One attempt of this node's workers: the supervisor that applies the monitors' decisions, the
monitors themselves (exits, hangs, membership, stragglers, signals), the progress snapshot they
read, and the node's workers port that starts an attempt (``node_workers.py``)."""
