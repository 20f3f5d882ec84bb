"""Monitoring."""
