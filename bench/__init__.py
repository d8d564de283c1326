"""Benchmarks of hf-layertie: every tying strategy trained side by side and measured (see bench/README.md)."""
