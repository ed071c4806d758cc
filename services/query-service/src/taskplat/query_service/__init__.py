"""Taskplat query service: read-only SQL over exactly the datasets a capability token pins."""
