"""Debugging aids any stage may import."""
