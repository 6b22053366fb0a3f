"""Checks that need a CUDA device: run them on one with the command in docs/development.md."""
