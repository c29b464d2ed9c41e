"""Accounting: goodput/ETTR, reliability (MTBF/MTTR), MFU and the incident cost stack, as pure functions."""
