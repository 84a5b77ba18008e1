"""Kortex's own evaluation set (issue 11): incidents as data, loaded through the public ingest
API, asked as a person would, scored on what the answer names and how it is grounded."""
