"""PySpark over the mount: the ``segments`` data source and the jobs that read segments."""
