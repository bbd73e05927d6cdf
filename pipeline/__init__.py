"""PySpark over mounted segments (DESIGN.md, "Layout"). Not built yet."""
