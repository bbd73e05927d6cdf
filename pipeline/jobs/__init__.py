"""Example jobs over mounted segments: ``segment-gateway pipeline run JOB`` or spark-submit."""
