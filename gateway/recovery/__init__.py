"""Disaster recovery and metadata in and out of a node: rebuild from Tier 2, export, import."""
