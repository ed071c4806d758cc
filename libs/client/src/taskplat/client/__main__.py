"""`python -m taskplat.client` runs the `taskplat` command."""

from taskplat.client.cli import cli

cli()
