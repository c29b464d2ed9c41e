"""Pure decisions with no I/O: restart budget, timeouts, world size, the job policy.

The ground floor: launch, diagnose and sim import it; it imports nothing above ``events`` and
``errors``.
"""
