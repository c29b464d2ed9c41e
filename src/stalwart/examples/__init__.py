"""Example training scripts used by the demo and the end-to-end tests."""
