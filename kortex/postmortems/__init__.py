"""Batch post-mortems (issue 12): the document a post-mortem is, the jobs that produce them."""
