"""Bulk embedding: a corpus in, vectors for a store out, through the served models (`python -m bulk_embed --help`)."""
