"""Hashing, manifests and the version catalog."""
