"""Programs and helpers the tests run."""
