"""Turning symptoms into incidents: stragglers, hang attribution, cross-layer rules."""
