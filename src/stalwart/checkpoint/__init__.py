"""Checkpoints: staging, tiers, manifest and checksums, atomic commit, fallback, retention."""
