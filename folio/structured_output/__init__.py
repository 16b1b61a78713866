"""Structured outputs: grammar backends, per-request grammar state, compiled off the step loop."""
