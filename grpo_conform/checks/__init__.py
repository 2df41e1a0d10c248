"""The checks: a registry of names, the conformance sequence, and how findings become outcomes."""
