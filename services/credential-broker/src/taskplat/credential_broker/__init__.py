"""Taskplat credential broker: capability token in, S3-scoped STS credentials out."""
